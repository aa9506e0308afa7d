//! Files that must never be seen half-written, and folders of numbered files of which only the
//! newest are kept and the newest intact one is resumed from.
//!
//! Guarantees: [`write_atomic`] writes a temporary file in the target's folder, fsyncs it, renames
//! it over the target and fsyncs the folder, so a process killed at any moment leaves the old file
//! or the new one, never a torn one, and a failed write (a full disk) leaves no temporary file
//! behind. The temporary file of a process that was killed mid-write stays until its writer starts
//! again and calls [`remove_partial`]. [`numbered`], [`keep_newest`], [`remove_partial`] and
//! [`newest_intact`] only ever touch files whose names the caller's parser accepts.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` atomically (see the module documentation); `mode` sets the permission
/// bits of a new file (e.g. `0o600` for a secret), `None` the process default.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: Option<u32>) -> io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(temporary_name(&name, std::process::id()));
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

/// The name [`write_atomic`] gives the temporary file of a write of `name` by process `pid`.
fn temporary_name(name: &str, pid: u32) -> String {
    format!(".{name}.tmp-{pid}")
}

/// The target name of a temporary file of [`write_atomic`], if `name` is one.
fn target_of_temporary(name: &str) -> Option<&str> {
    let (target, pid) = name.strip_prefix('.')?.rsplit_once(".tmp-")?;
    (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(target)
}

/// Removes the temporary files that writes of [`write_atomic`] left in `dir` when their process
/// was killed mid-write, for the targets whose name `number` accepts; returns how many it removed.
/// A writer calls it when it starts, before its first write: it owns the folder's files from then
/// on. Nothing happens when `dir` does not exist.
pub fn remove_partial(dir: &Path, number: impl Fn(&str) -> Option<u64>) -> io::Result<usize> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        let partial = entry.file_name().to_str().and_then(target_of_temporary).and_then(&number).is_some();
        if partial && entry.file_type()?.is_file() {
            fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// What [`newest_intact`] found.
#[derive(Debug, PartialEq)]
pub enum Newest<T, E> {
    /// No numbered file at all.
    Nothing,
    /// The newest file that loaded, and how many newer ones were damaged and skipped.
    Loaded {
        /// The file.
        path: PathBuf,
        /// What `load` made of it.
        value: T,
        /// Newer files skipped as damaged.
        skipped: usize,
    },
    /// `load` refused `path` for a reason other than damage (another job's file, say); older files
    /// were not tried, since they would be refused alike or resume the wrong run.
    Refused {
        /// The file.
        path: PathBuf,
        /// Why.
        error: E,
    },
    /// Every numbered file is damaged.
    NoneIntact {
        /// Files tried.
        found: usize,
        /// The newest file and its problem.
        newest: PathBuf,
        /// Its problem.
        error: E,
    },
}

/// The one rule for resuming from a folder of numbered checkpoints: tries them newest first with
/// `load`, skips (and logs) every file whose error `damaged` calls damage — cut short, failing its
/// checksum, unreadable — and stops at the first that loads or that is refused for another reason.
pub fn newest_intact<T, E: std::fmt::Display>(
    dir: &Path,
    number: impl Fn(&str) -> Option<u64>,
    mut load: impl FnMut(&Path) -> Result<T, E>,
    damaged: impl Fn(&E) -> bool,
) -> io::Result<Newest<T, E>> {
    let found = numbered(dir, number)?;
    let mut first_damage = None;
    for (skipped, (_, path)) in found.iter().rev().enumerate() {
        match load(path) {
            Ok(value) => return Ok(Newest::Loaded { path: path.clone(), value, skipped }),
            Err(error) if damaged(&error) => {
                tracing::error!(path = %path.display(), problem = %error, "skipping a checkpoint that failed its checks; trying the one before");
                first_damage.get_or_insert((path.clone(), error));
            }
            Err(error) => return Ok(Newest::Refused { path: path.clone(), error }),
        }
    }
    Ok(match first_damage {
        None => Newest::Nothing,
        Some((newest, error)) => Newest::NoneIntact { found: found.len(), newest, error },
    })
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
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // The rename fails: the target is a folder that is not empty.
        let target = dir.path().join("f-1");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), b"").unwrap();
        assert!(write_atomic(&target, b"bytes", None).is_err());
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("f-1")]);
    }

    #[test]
    fn remove_partial_removes_only_the_callers_temporary_files() {
        let dir = tempfile::tempdir().unwrap();
        let pid = std::process::id() + 1;
        let mine = [temporary_name("f-3", pid), temporary_name("f-10", 7)];
        let others = ["f-3", ".other.tmp-12", ".f-4.tmp-", ".f-4.tmp-x", "f-5.tmp-3"];
        for name in mine.iter().map(String::as_str).chain(others) {
            fs::write(dir.path().join(name), b"partial").unwrap();
        }
        assert_eq!(remove_partial(dir.path(), step).unwrap(), 2);
        let mut left: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        let mut want: Vec<String> = others.iter().map(|s| s.to_string()).collect();
        want.sort();
        assert_eq!(left, want);
        assert_eq!(remove_partial(&dir.path().join("missing"), step).unwrap(), 0);
    }

    #[test]
    fn newest_intact_skips_damaged_files_and_stops_at_a_refused_one() {
        let dir = tempfile::tempdir().unwrap();
        let load = |path: &Path| -> Result<String, String> {
            let text = fs::read_to_string(path).map_err(|e| e.to_string())?;
            match text.as_str() {
                "damaged" => Err("damaged".into()),
                "foreign" => Err("foreign".into()),
                good => Ok(good.to_owned()),
            }
        };
        let damaged = |e: &String| e == "damaged";
        let found = || newest_intact(dir.path(), step, load, damaged).unwrap();
        assert_eq!(found(), Newest::Nothing);
        for (name, text) in [("f-1", "one"), ("f-2", "two"), ("f-3", "damaged"), ("f-4", "damaged")] {
            fs::write(dir.path().join(name), text).unwrap();
        }
        assert_eq!(found(), Newest::Loaded { path: dir.path().join("f-2"), value: "two".into(), skipped: 2 });
        fs::write(dir.path().join("f-2"), "foreign").unwrap();
        assert_eq!(found(), Newest::Refused { path: dir.path().join("f-2"), error: "foreign".into() });
        for name in ["f-1", "f-2"] {
            fs::write(dir.path().join(name), "damaged").unwrap();
        }
        assert_eq!(
            found(),
            Newest::NoneIntact { found: 4, newest: dir.path().join("f-4"), error: "damaged".into() }
        );
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
