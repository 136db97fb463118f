#!/usr/bin/env bash
# The packages as crates.io would receive them, and proof that they work on
# their own. Run by .ci/run; by hand from anywhere in the repository:
#   bash scripts/package-check.sh
#
# 1. `cargo package` for every published crate in one pass (local path
#    dependencies go through a temporary registry): each is packaged and
#    verified, i.e. built from its .crate alone, so a file it needs from
#    outside its folder (an include_str! of ../../docs, say) fails here.
# 2. Each .crate holds its README.md, LICENSE-MIT and LICENSE-APACHE.
# 3. A scratch crate in a temporary directory, outside the workspace, depends
#    on the unpacked dbworker and dbworker-testkit by path (with the
#    unpacked workerutil patched in for the version dbworker's packaged
#    manifest names) and runs the example of dbworker's packaged README: a
#    typed job enqueued and run end to end against a throwaway cluster (or
#    DATABASE_URL's server), its row then checked `completed`.
#
# Cost: the builds share the workspace's target directory, so the scratch
# crate reuses what the verification compiled; debug info is off for them
# (CARGO_PROFILE_DEV_DEBUG), as these builds are only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
export CARGO_PROFILE_DEV_DEBUG=false
started=$SECONDS
step() { echo "package-check [$((SECONDS - started)) s]: $*"; }

# Cargo unpacks the temporary registry's crates under CARGO_HOME, in a folder
# named after the registry's path, and reuses an unpacked crate of the same
# name and version: a second run from the same checkout would verify the
# first run's sources. Remove our crates' old unpacked copies first.
version=$(cargo pkgid --offline -p dbworker | sed 's/.*[#@]//')
for crate in workerutil dbworker-testkit dbworker dbworker-cli; do
    rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/"$crate-$version"
done
# Not published (publish = false): the suite of examples and end-to-end tests
# (the root package), the protocol models, the benchmark.
step "cargo package: every published crate, each verified from its package alone"
cargo package --workspace --offline --allow-dirty \
    --exclude dbworker-suite --exclude dbworker-models --exclude dbworker-bench

packages="$CARGO_TARGET_DIR/package"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/dbworker-package-check.XXXXXX")
trap 'rm -rf "$scratch"' EXIT

for crate in workerutil dbworker-testkit dbworker dbworker-cli; do
    file="$packages/$crate-$version.crate"
    [ -f "$file" ] || { echo "package-check: $file was not written" >&2; exit 1; }
    listing=$(tar -tzf "$file")
    for need in README.md LICENSE-MIT LICENSE-APACHE; do
        grep -qx "$crate-$version/$need" <<<"$listing" ||
            { echo "package-check: $crate-$version.crate has no $need" >&2; exit 1; }
    done
    tar -xzf "$file" -C "$scratch"
    step "$crate-$version.crate: $(wc -l <<<"$listing") files, with README.md and both licenses; unpacked"
done

app="$scratch/app"
mkdir -p "$app/src"
cat >"$app/Cargo.toml" <<EOF
[package]
name = "dbworker-package-check"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
dbworker = { path = "../dbworker-$version" }
dbworker-testkit = { path = "../dbworker-testkit-$version" }
serde = { version = "1", features = ["derive"] }
sqlx = { version = "0.9", default-features = false, features = ["postgres", "runtime-tokio"] }
tokio = { version = "1", features = ["macros", "rt-multi-thread"] }

# The packaged dbworker names workerutil by version, as from crates.io.
[patch.crates-io]
workerutil = { path = "../workerutil-$version" }

[workspace]
EOF
# The workspace's versions of every other dependency, as `cargo test` uses.
cp Cargo.lock "$app/Cargo.lock"

# The first Rust block of the README that ships in the dbworker package.
# Its `main` is made `pub`, for this crate's own main to call.
awk '/^```rust/ { inside = 1; next } inside && /^```/ { exit }
     inside { sub(/^async fn main/, "pub async fn main"); print }' \
    "$scratch/dbworker-$version/README.md" >"$app/src/readme.rs"
[ -s "$app/src/readme.rs" ] || { echo "package-check: dbworker's README has no Rust example" >&2; exit 1; }

cat >"$app/src/main.rs" <<'EOF'
//! Runs the example of dbworker's packaged README, built against the packages.
mod readme;

use std::process::Command;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if std::env::args().nth(1).as_deref() == Some("readme") {
        return readme::main();
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    // A database of its own, on DATABASE_URL's server or on a throwaway
    // cluster started by the packaged dbworker-testkit.
    let db = runtime.block_on(dbworker_testkit::TestDatabase::new())?;
    println!("package-check: the README's example, on database {}", db.name());
    let status = Command::new(std::env::current_exe()?)
        .arg("readme")
        .env("DATABASE_URL", db.url())
        .status()?;
    assert!(status.success(), "the README's example failed: {status}");
    let jobs: Vec<(String, String)> = runtime.block_on(async {
        let pool = db.pool(1).await?;
        let jobs = sqlx::query_as("SELECT kind, state FROM jobs")
            .fetch_all(&pool)
            .await?;
        pool.close().await;
        Ok::<_, Box<dyn std::error::Error>>(jobs)
    })?;
    assert_eq!(
        jobs,
        [("send_email".to_owned(), "completed".to_owned())],
        "the README's typed job ran once, to completion"
    );
    println!("package-check: the typed job ran end to end: {jobs:?}");
    Ok(())
}
EOF

step "building a crate outside the workspace ($app) on the packaged dbworker"
cargo build --offline --manifest-path "$app/Cargo.toml"
step "running it"
"$CARGO_TARGET_DIR/debug/dbworker-package-check" | tee "$scratch/output"
grep -qx "sent to ada@example.com" "$scratch/output" ||
    { echo "package-check: the README's handler did not run" >&2; exit 1; }
step "done: the packages build and work on their own"
