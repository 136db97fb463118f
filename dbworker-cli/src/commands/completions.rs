//! `dbworker completions bash|zsh|fish|…`: the shell's completion script for
//! every subcommand and flag, from the same clap description the binary parses.

use clap::{Args, Command};
use clap_complete::Shell;

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell: bash, zsh, fish, elvish or powershell.
    shell: Shell,
}

/// Prints the completion script of `command` for the shell.
pub(crate) fn completions(args: CompletionsArgs, mut command: Command) {
    clap_complete::generate(args.shell, &mut command, "dbworker", &mut std::io::stdout());
}
