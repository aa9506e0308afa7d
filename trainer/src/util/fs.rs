//! Files that must never be seen half-written, and folders of numbered files of which only the
//! newest are kept.
//!
//! Guarantees: [`write_atomic`] writes a temporary file in the target's folder, fsyncs it, renames
//! it over the target and fsyncs the folder, so a process killed at any moment leaves the old file
//! or the new one, never a torn one, and a failed write leaves no temporary file behind.
//! [`numbered`] and [`keep_newest`] only ever see files whose names the caller's parser accepts.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` atomically (see the module documentation); `mode` sets the permission
/// bits of a new file (e.g. `0o600` for a secret), `None` the process default.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: Option<u32>) -> io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        if let Some(mode) = mode {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(mode);
        }
        let mut f = options.open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        // Make the rename itself durable.
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// The files in `dir` whose name `number` maps to a number, sorted by that number (oldest first);
/// empty when `dir` does not exist.
pub fn numbered(dir: &Path, number: impl Fn(&str) -> Option<u64>) -> io::Result<Vec<(u64, PathBuf)>> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry?;
        if let Some(n) = entry.file_name().to_str().and_then(&number) {
            found.push((n, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Deletes all but the `keep` highest-numbered files of [`numbered`]; `keep == 0` keeps all.
pub fn keep_newest(dir: &Path, keep: usize, number: impl Fn(&str) -> Option<u64>) -> io::Result<()> {
    if keep == 0 {
        return Ok(());
    }
    let found = numbered(dir, number)?;
    for (_, path) in found.iter().take(found.len().saturating_sub(keep)) {
        fs::remove_file(path)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn step(name: &str) -> Option<u64> {
        name.strip_prefix("f-")?.parse().ok()
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("secret");
        write_atomic(&path, b"one", Some(0o600)).unwrap();
        write_atomic(&path, b"two", Some(0o600)).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let names: Vec<_> =
            fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("secret")]);
    }

    #[test]
    fn keep_newest_deletes_only_the_oldest_numbered_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["f-3", "f-10", "f-7", "other", "f-x"] {
            fs::write(dir.path().join(name), b"").unwrap();
        }
        keep_newest(dir.path(), 2, step).unwrap();
        let left: Vec<u64> = numbered(dir.path(), step).unwrap().into_iter().map(|(n, _)| n).collect();
        assert_eq!(left, [7, 10]);
        assert!(dir.path().join("other").exists() && dir.path().join("f-x").exists());
        assert!(numbered(&dir.path().join("missing"), step).unwrap().is_empty());
    }
}
