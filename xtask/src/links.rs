//! The internal-link check of the documentation: every relative link and image in the README,
//! ARCHITECTURE.md, `bench/README.md` and the user guide (`docs/src/`) must name a file or folder
//! that exists, and an anchor (`#section`) must name a heading of that Markdown file, with the ids
//! mdBook and GitHub give headings. Links of the user guide must stay inside `docs/src/`, which is
//! all that mdBook copies into the book. External links (`http:`, `https:`, `mailto:`) are not
//! fetched: nothing outside this machine can be reached from a test.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result};

/// The Markdown outside the guide whose links are checked, from the repository root.
pub const PAGES: &[&str] = &["README.md", "ARCHITECTURE.md", "bench/README.md"];

/// The user guide's sources, from the repository root.
pub const BOOK: &str = "docs/src";

/// One broken link: the file, its line, the target and what is wrong.
#[derive(Debug, PartialEq, Eq)]
pub struct Broken {
    pub file: PathBuf,
    pub line: usize,
    pub target: String,
    pub why: String,
}

impl std::fmt::Display for Broken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}: {} ({})", self.file.display(), self.line, self.target, self.why)
    }
}

/// Checks every page and every Markdown file of the book under `root`.
pub fn check(root: &Path) -> Result<Vec<Broken>> {
    let root = normalise(root);
    let root = root.as_path();
    let mut files: Vec<PathBuf> = PAGES.iter().map(|p| root.join(p)).collect();
    markdown_under(&root.join(BOOK), &mut files)?;
    let book = root.join(BOOK);
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let inside = file.starts_with(&book).then_some(book.as_path());
        for (line, target) in links(&text) {
            if let Err(why) = check_target(file, &target, inside) {
                let file = file.strip_prefix(root).unwrap_or(file).to_path_buf();
                broken.push(Broken { file, line, target, why });
            }
        }
    }
    Ok(broken)
}

fn markdown_under(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            markdown_under(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
    Ok(())
}

/// Checks one target written in `file`; `inside` is the folder the target must stay in.
fn check_target(file: &Path, target: &str, inside: Option<&Path>) -> Result<(), String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return Ok(()); // external: not fetched here
    }
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    let dir = file.parent().unwrap_or(Path::new("."));
    let resolved = if path.is_empty() { file.to_path_buf() } else { normalise(&dir.join(path)) };
    if let Some(inside) = inside
        && !resolved.starts_with(inside)
    {
        return Err(format!("leaves {}: the book holds only what is under it", inside.display()));
    }
    if !resolved.exists() {
        return Err(format!("no such file: {}", resolved.display()));
    }
    if anchor.is_empty() {
        return Ok(());
    }
    if resolved.extension().is_none_or(|e| e != "md") {
        return Err(
            "an anchor is checked only in Markdown; link to the file and name what to look for".to_owned()
        );
    }
    let text =
        std::fs::read_to_string(&resolved).map_err(|e| format!("reading {}: {e}", resolved.display()))?;
    if anchors(&text).contains(anchor) {
        Ok(())
    } else {
        Err(format!("no heading or id `{anchor}` in {}", resolved.display()))
    }
}

/// `a/b/../c` → `a/c`, without touching the file system.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The lines of `text` outside fenced code blocks, numbered from 1.
fn prose(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fence: Option<&str> = None;
    text.lines().enumerate().filter_map(move |(i, line)| {
        let trimmed = line.trim_start();
        for mark in ["```", "~~~"] {
            if trimmed.starts_with(mark) {
                match fence {
                    Some(open) if open == mark => fence = None,
                    None => fence = Some(mark),
                    Some(_) => {}
                }
                return None;
            }
        }
        if fence.is_some() { None } else { Some((i + 1, line)) }
    })
}

/// `line` with its inline code spans blanked out, so that code is never read as a link.
fn without_code(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(open) = rest.find('`') {
        let run = rest[open..].chars().take_while(|&c| c == '`').count();
        let ticks = &rest[open..open + run];
        let after = &rest[open + run..];
        match after.find(ticks) {
            Some(close) => {
                out.push_str(&rest[..open]);
                out.push_str(&" ".repeat(run * 2 + close));
                rest = &after[close + run..];
            }
            None => {
                out.push_str(&rest[..open + run]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every link target of `text` with its line: inline links and images (`[t](x)`), reference
/// definitions (`[t]: x`) and HTML `href`/`src` attributes.
pub fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in prose(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or_default();
            let target = target.trim_start_matches('<').trim_end_matches('>');
            out.push((n, target.to_owned()));
            rest = &after[end..];
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('[')
            && let Some(close) = trimmed.find("]: ")
        {
            let target = trimmed[close + 3..].split_whitespace().next().unwrap_or_default();
            out.push((n, target.to_owned()));
        }
        for attr in ["href=\"", "src=\""] {
            let mut rest = line.as_str();
            while let Some(at) = rest.find(attr) {
                let after = &rest[at + attr.len()..];
                let end = after.find('"').unwrap_or(after.len());
                out.push((n, after[..end].to_owned()));
                rest = &after[end..];
            }
        }
    }
    out.retain(|(_, t)| !t.is_empty());
    out
}

/// The anchors of a Markdown file: its headings' ids (a repeated one gets `-1`, `-2`, …, as mdBook
/// and GitHub number them) and every `id="…"` of its HTML.
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let base = slug(&heading_text(line[hashes..].trim().trim_end_matches('#').trim()));
            let mut id = base.clone();
            let mut n = 0;
            while ids.contains(&id) {
                n += 1;
                id = format!("{base}-{n}");
            }
            ids.insert(id);
        }
        let mut rest = line;
        while let Some(at) = rest.find("id=\"") {
            let after = &rest[at + 4..];
            let end = after.find('"').unwrap_or(after.len());
            ids.insert(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    ids
}

/// A heading as rendered text: code ticks dropped, links reduced to their text.
fn heading_text(heading: &str) -> String {
    let mut out = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match (after.find("]("), after.find(')')) {
            (Some(close), Some(end)) if close < end => {
                out.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            _ => {
                out.push('[');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.replace('`', "")
}

/// The id mdBook (and GitHub) give a heading: letters, digits, `_` and `-` kept and lower-cased,
/// white space as `-`, everything else dropped.
pub fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().collect::<String>())
            } else if c.is_whitespace() {
                Some("-".to_owned())
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::expect_used)] // tests fail loudly by design
mod tests {
    use super::*;

    #[test]
    fn headings_get_mdbooks_ids() {
        let ids = anchors(
            "# Run `tandem plan`: a shape\n## Tests\n## Tests\n```\n# not a heading\n```\n<a id=\"x\"></a>\n",
        );
        let expected: BTreeSet<String> =
            ["run-tandem-plan-a-shape", "tests", "tests-1", "x"].into_iter().map(str::to_owned).collect();
        assert_eq!(ids, expected);
        assert_eq!(slug("EKS and InfiniBand/EFA"), "eks-and-infinibandefa");
    }

    #[test]
    fn links_outside_code_are_found() {
        let text = "See [a](a.md#x) and `[b](b.md)`.\n```\n[c](c.md)\n```\n[d]: d.md\n<img src=\"e.svg\">\n";
        let found: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
        assert_eq!(found, ["a.md#x", "d.md", "e.svg"]);
    }

    #[test]
    fn broken_files_anchors_and_escapes_are_reported() {
        let root = std::env::temp_dir().join(format!("tandem-links-{}", std::process::id()));
        let book = root.join(BOOK);
        std::fs::create_dir_all(&book).expect("temp dir");
        std::fs::create_dir_all(root.join("bench")).expect("temp dir");
        std::fs::write(
            root.join("README.md"),
            "[ok](ARCHITECTURE.md#map) [gone](nowhere.md) [bad](ARCHITECTURE.md#nope)\n",
        )
        .expect("write");
        std::fs::write(root.join("ARCHITECTURE.md"), "# Map\n[web](https://example.invalid/x)\n")
            .expect("write");
        std::fs::write(root.join("bench/README.md"), "[up](../README.md)\n").expect("write");
        std::fs::write(book.join("a.md"), "[out](../../README.md) [in](b.md)\n").expect("write");
        let broken = check(&root).expect("check runs");
        std::fs::remove_dir_all(&root).expect("clean up");
        let targets: Vec<&str> = broken.iter().map(|b| b.target.as_str()).collect();
        assert_eq!(targets, ["nowhere.md", "ARCHITECTURE.md#nope", "../../README.md", "b.md"]);
    }
}
