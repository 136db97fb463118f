//! Where `--write-docs` records a run. docs/benchmarks.md is a front page
//! arranged by hand (the current figures, a reading guide), so the benchmark
//! writes there only between two markers: a short summary of the newest run.
//! The run's whole section goes to docs/benchmarks-archive.md, first among
//! the runs there (newest first), every older section left as it was.

use std::path::Path;

use crate::Result;

/// The front page, under docs/.
pub(crate) const FRONT_PAGE: &str = "benchmarks.md";
/// Every recorded run, newest first, under docs/ beside the front page.
pub(crate) const ARCHIVE: &str = "benchmarks-archive.md";

/// Opens every run's section in the archive, followed by its run id (the
/// commit measured) and ` -->`.
const RUN_MARKER: &str = "<!-- bench run ";
/// The line before the front page's generated block.
const LATEST_START: &str = "<!-- latest run: written by the benchmark -->";
/// The line after it.
const LATEST_END: &str = "<!-- end latest run -->";

/// The line that opens the section of run `id`.
pub(crate) fn run_marker(id: &str) -> String {
    format!("{RUN_MARKER}{id} -->")
}

/// GitHub's anchor for a heading: lower case, spaces to hyphens, other
/// punctuation dropped (`Run of 2026-11-26 20:50 UTC, commit 81ffd2c` →
/// `run-of-2026-11-26-2050-utc-commit-81ffd2c`), so that the front page can
/// link to a run's section in the archive.
pub(crate) fn anchor(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// Records run `run_id`: `section` (opened by its [`run_marker`]) first among
/// the archive's runs, `summary` between the front page's markers, and the
/// chart when the run drew one; returns the paths written.
pub(crate) fn write(
    run_id: &str,
    section: &str,
    summary: &str,
    svg: Option<String>,
) -> Result<Vec<String>> {
    let docs = crate::workspace_root().join("docs");
    let mut written = Vec::new();
    if let Some(svg) = svg {
        let path = docs.join(crate::chart::FILE_NAME);
        std::fs::write(&path, svg)?;
        written.push(path.display().to_string());
    }
    // The archive before the front page: it is the record of the run, and it
    // must not be lost to a front page whose markers were edited away.
    let archive_path = docs.join(ARCHIVE);
    let archive = read_or(&archive_path, crate::provenance::intro)?;
    std::fs::write(&archive_path, into_archive(&archive, run_id, section))?;
    written.push(archive_path.display().to_string());
    let page_path = docs.join(FRONT_PAGE);
    let page = read_or(&page_path, String::new)?;
    let page = into_front_page(&page, summary).map_err(|why| {
        format!(
            "{}: {why}; left unchanged (the run is recorded in {})",
            page_path.display(),
            archive_path.display()
        )
    })?;
    std::fs::write(&page_path, page)?;
    written.push(page_path.display().to_string());
    Ok(written)
}

/// The file's text, or `missing()` when there is no such file yet (any other
/// error stops the write, so that a file that could not be read is never
/// replaced by one built from nothing).
fn read_or(path: &Path, missing: impl FnOnce() -> String) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(missing()),
        Err(e) => Err(format!("{}: {e}", path.display()).into()),
    }
}

/// The archive with `section` first among its runs: after the header (the
/// text before the first run marker), before the run that was newest. An
/// earlier section of the same run id is dropped, as a new run of the same
/// commit replaces it; every other section stays byte for byte (the file
/// ends in one newline).
pub(crate) fn into_archive(archive: &str, run_id: &str, section: &str) -> String {
    let starts = section_starts(archive);
    let header = archive[..starts.first().copied().unwrap_or(archive.len())].trim_end();
    let mut out = header.to_owned();
    if !out.is_empty() {
        out.push_str("\n\n");
    }
    out.push_str(section.trim_end());
    out.push_str("\n\n");
    let mine = run_marker(run_id);
    let ends = starts.iter().skip(1).copied().chain([archive.len()]);
    for (start, end) in starts.iter().copied().zip(ends) {
        let old = &archive[start..end];
        if !old.starts_with(&mine) {
            out.push_str(old);
        }
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// Where each run's section starts: at each run marker that opens a line. A
/// marker quoted inside a paragraph (the archive's header names it) opens
/// no section.
fn section_starts(doc: &str) -> Vec<usize> {
    doc.match_indices(RUN_MARKER)
        .map(|(i, _)| i)
        .filter(|&i| opens_line(doc, i))
        .collect()
}

/// The front page with `summary` between its latest-run markers, and every
/// byte outside them as it was. A page without the markers gets them in a
/// "Latest run" section at its end, which later runs then replace in place.
pub(crate) fn into_front_page(page: &str, summary: &str) -> Result<String> {
    // Blank lines around the summary: a table must end before the end
    // marker, and the start marker's HTML block before the summary.
    let block = format!("{LATEST_START}\n\n{}\n\n{LATEST_END}", summary.trim_end());
    let Some(start) = line_with(page, LATEST_START, 0) else {
        let page = page.trim_end();
        let gap = if page.is_empty() { "" } else { "\n\n" };
        return Ok(format!("{page}{gap}## Latest run\n\n{block}\n"));
    };
    // Without its end marker the block's extent is unknown: replacing up to
    // the end of the page would take the hand-written text after it.
    let end = line_with(page, LATEST_END, start + LATEST_START.len())
        .ok_or_else(|| format!("a `{LATEST_START}` line without a `{LATEST_END}` line after it"))?;
    Ok(format!(
        "{}{block}{}",
        &page[..start],
        &page[end + LATEST_END.len()..]
    ))
}

/// The first offset at or after `from` where `marker` opens a line, so that
/// a marker named in running text (or in the page's top comment) is not
/// taken for the block's edge.
fn line_with(doc: &str, marker: &str, from: usize) -> Option<usize> {
    doc[from..]
        .match_indices(marker)
        .map(|(i, _)| from + i)
        .find(|&i| opens_line(doc, i))
}

/// Whether byte `i` of `doc` (a char boundary) is the start of a line.
fn opens_line(doc: &str, i: usize) -> bool {
    i == 0 || doc[..i].ends_with('\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive's header, naming the marker in running text as the real
    /// one does.
    const HEADER: &str = "# Benchmark runs: the archive\n\n\
        Every run, newest first, each led by its `<!-- bench run … -->` marker.\n\n\
        ## How to read this\n\n- Only ratios within one run count.\n\n";

    /// A run's section as `Report::markdown_section` lays it out.
    fn section(id: &str, table: &str) -> String {
        format!(
            "{}\n## Run of {id}\n\n### Burn-down\n\n| jobs/s |\n|---|\n| {table} |\n\n",
            run_marker(id)
        )
    }

    /// Sections as they stand in the archive: one blank line between them,
    /// one newline at the end.
    fn archived(sections: &[String]) -> String {
        let joined: Vec<&str> = sections.iter().map(|s| s.trim_end()).collect();
        format!("{}\n", joined.join("\n\n"))
    }

    #[test]
    fn a_third_run_goes_first_in_the_archive_and_between_the_front_pages_markers() {
        let old = archived(&[section("bbb", "2"), section("aaa", "1")]);
        // A note added by hand to a run stays with it.
        let old = old.replace("| 1 |\n", "| 1 |\n\nA note by hand.\n");
        let archive = format!("{HEADER}{old}");
        let new = section("ccc", "3");
        let merged = into_archive(&archive, "ccc", &new);
        assert_eq!(merged, format!("{HEADER}{}\n\n{old}", new.trim_end()));

        let before = "# Benchmarks\n\n## Current figures\n\nBy hand.\n\n## Latest run\n\n";
        let after = "\n\n## Archive\n\nBy hand too.\n";
        let page = format!("{before}{LATEST_START}\n\nRun of bbb.\n\n{LATEST_END}{after}");
        let written = into_front_page(&page, "Run of ccc.\n\n| jobs/s |\n|---|\n| 3 |\n").unwrap();
        assert_eq!(
            written,
            format!(
                "{before}{LATEST_START}\n\nRun of ccc.\n\n| jobs/s |\n|---|\n| 3 |\n\n{LATEST_END}{after}"
            )
        );
    }

    #[test]
    fn a_new_run_of_the_same_commit_replaces_its_section_and_goes_first() {
        let archive = format!(
            "{HEADER}{}",
            archived(&[
                section("bbb", "2"),
                section("aaa+dirty", "1.5"),
                section("aaa", "1"),
            ])
        );
        let merged = into_archive(&archive, "aaa", &section("aaa", "9"));
        assert_eq!(
            merged,
            format!(
                "{HEADER}{}",
                archived(&[
                    section("aaa", "9"),
                    section("bbb", "2"),
                    section("aaa+dirty", "1.5"),
                ])
            )
        );
    }

    #[test]
    fn the_first_run_goes_after_the_header() {
        let first = section("aaa", "1");
        assert_eq!(
            into_archive(HEADER, "aaa", &first),
            format!("{HEADER}{}\n", first.trim_end())
        );
        assert_eq!(
            into_archive("", "aaa", &first),
            format!("{}\n", first.trim_end())
        );
    }

    #[test]
    fn a_front_page_without_markers_gets_them_at_its_end_once() {
        let page = "# Benchmarks\n\nBy hand.\n";
        let once = into_front_page(page, "Run of aaa.").unwrap();
        assert_eq!(
            once,
            format!(
                "# Benchmarks\n\nBy hand.\n\n## Latest run\n\n{LATEST_START}\n\nRun of aaa.\n\n{LATEST_END}\n"
            )
        );
        let twice = into_front_page(&once, "Run of bbb.").unwrap();
        assert_eq!(twice, once.replace("Run of aaa.", "Run of bbb."));
    }

    #[test]
    fn a_start_marker_without_its_end_is_refused() {
        let page = format!("# Benchmarks\n\n{LATEST_START}\n\nRun of aaa.\n\n## Archive\n");
        assert!(into_front_page(&page, "Run of bbb.").is_err());
    }

    #[test]
    fn markers_in_running_text_are_not_the_blocks_edges() {
        let page = format!(
            "Between `{LATEST_START}` and `{LATEST_END}`.\n\n{LATEST_START}\n\nold\n\n{LATEST_END}\n"
        );
        let written = into_front_page(&page, "new").unwrap();
        assert_eq!(written, page.replace("\nold\n", "\nnew\n"));
    }

    #[test]
    fn anchors_follow_githubs_headings() {
        assert_eq!(
            anchor("Run of 2026-11-26 20:50 UTC, commit 81ffd2c"),
            "run-of-2026-11-26-2050-utc-commit-81ffd2c"
        );
        assert_eq!(
            anchor("Run of 2026-11-23 15:31 UTC, commit a93ab54+dirty"),
            "run-of-2026-11-23-1531-utc-commit-a93ab54dirty"
        );
    }
}
