//! Fixture loading shared by the api tests.
#![allow(dead_code, clippy::expect_used)] // each test target uses a subset; tests fail loudly

use std::path::{Path, PathBuf};

/// Root of the workspace.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `*.yaml` under `dir`, sorted, with its text.
pub fn yaml_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()));
            (p, text)
        })
        .collect()
}

/// The message an invalid fixture must be refused with: its `# expect: …` first line.
pub fn expected_message(path: &Path, text: &str) -> String {
    text.lines()
        .next()
        .and_then(|l| l.strip_prefix("# expect: "))
        .unwrap_or_else(|| panic!("{} must start with `# expect: <message>`", path.display()))
        .trim()
        .to_owned()
}

/// The example manifests users run.
pub fn examples() -> Vec<(PathBuf, String)> {
    yaml_files(&workspace().join("examples"))
}

/// Manifests that the CRD must refuse.
pub fn invalid_fixtures() -> Vec<(PathBuf, String)> {
    yaml_files(&workspace().join("api/tests/fixtures/invalid"))
}
