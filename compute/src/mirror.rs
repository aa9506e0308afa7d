//! Checkpoints kept in object storage (`training.checkpoint.url: s3://<bucket>/<prefix>`): the
//! checkpoint folders stay where they are (a worker's `<output>/checkpoints`, a PS shard's
//! `<output>/ps-<index>`: an emptyDir, a claim, the runner's output folder) and become a cache of
//! `<prefix>/<job name>/` in the bucket, under the same relative names. A job that is deleted and
//! re-created, or a PS rescheduled to another node with an empty folder, finds its checkpoints
//! there.
//!
//! Expected flow: a writer builds the job's [`Mirror`] ([`Mirror::of`]); before it looks for a
//! checkpoint to resume from, it [`Mirror::restore`]s its folder (the checkpoints in the store
//! that the folder lacks are downloaded); after each checkpoint it writes (atomically, locally)
//! and prunes, it [`Mirror::push`]es the folder (the files the store lacks are uploaded, those
//! the folder no longer holds are deleted from it), so the store holds what the folder holds.
//!
//! Guarantees: only files that `is_checkpoint` accepts (by name: never a partial write's
//! temporary file) are copied, either way; a download lands under a temporary name and is renamed
//! into place, so an interrupted restore leaves no file that looks whole; checkpoint files are
//! immutable once named, so a name present on both sides is not copied again. Every error names
//! the URL and what to do ([`DataError`] from [`store`]); the caller decides whether it stops the
//! job (a writer fails its checkpoint, as for a full disk).

use std::path::{Path, PathBuf};

use tandem_api::TrainingJobSpec;

use tandem_input::DataError;
use tandem_input::store;

/// The job's checkpoint prefix in object storage, and the local folder it mirrors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mirror {
    /// The process's output folder, whose checkpoint folders are mirrored.
    local: PathBuf,
    /// `s3://<bucket>/<prefix>/<job name>`.
    remote: PathBuf,
}

impl Mirror {
    /// The mirror of the checkpoints under `output` of job `job` (its name) with `spec`, if its
    /// `training.checkpoint.url` names one; sets how that bucket is reached
    /// (`training.checkpoint.s3`).
    pub fn of(spec: &TrainingJobSpec, job: &str, output: &Path) -> Option<Self> {
        let checkpoint = &spec.training.checkpoint;
        let url = checkpoint.url.as_deref()?.trim_end_matches('/');
        let remote = PathBuf::from(format!("{url}/{job}"));
        store::configure_bucket(&remote, checkpoint.s3.as_ref());
        Some(Self { local: output.to_owned(), remote })
    }

    /// The store's counterpart of the local folder `dir` (under the output folder).
    fn remote_of(&self, dir: &Path) -> PathBuf {
        let relative = dir.strip_prefix(&self.local).unwrap_or(dir);
        let relative = relative.to_string_lossy();
        let relative = relative.trim_matches('/');
        if relative.is_empty() {
            self.remote.clone()
        } else {
            PathBuf::from(format!("{}/{relative}", self.remote.display()))
        }
    }

    /// Downloads into `dir` the checkpoints (names `is_checkpoint` accepts) that the store holds
    /// and `dir` lacks; returns how many. A prefix with nothing under it is no error: the job has
    /// not checkpointed yet.
    pub fn restore(&self, dir: &Path, is_checkpoint: impl Fn(&str) -> bool) -> Result<usize, DataError> {
        let remote = self.remote_of(dir);
        let listed = store::list_objects(&remote)?;
        let mut copied = 0;
        for name in listed.into_iter().filter(|n| is_checkpoint(n)) {
            let target = dir.join(&name);
            if target.exists() {
                continue;
            }
            let from = PathBuf::from(format!("{}/{name}", remote.display()));
            let bytes = store::read(&from)?;
            tandem_util::fs::write_atomic(&target, &bytes, None)
                .map_err(|source| DataError::Io { path: target.clone(), source })?;
            tracing::info!(from = %from.display(), to = %target.display(), "restored a checkpoint from object storage");
            copied += 1;
        }
        Ok(copied)
    }

    /// Makes the store's copy of `dir` hold the checkpoints `dir` holds: uploads those it lacks,
    /// deletes those `dir` no longer has (pruned).
    pub fn push(&self, dir: &Path, is_checkpoint: impl Fn(&str) -> bool) -> Result<(), DataError> {
        let remote = self.remote_of(dir);
        let listed = store::list_objects(&remote)?;
        let io = |source| DataError::Io { path: dir.to_owned(), source };
        let mut local = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let name = entry.map_err(io)?.file_name().to_string_lossy().into_owned();
            if is_checkpoint(&name) {
                local.push(name);
            }
        }
        for name in local.iter().filter(|n| !listed.contains(n)) {
            store::upload(&dir.join(name), &remote)?;
        }
        for name in listed.iter().filter(|n| is_checkpoint(n) && !local.contains(n)) {
            store::delete(&PathBuf::from(format!("{}/{name}", remote.display())))?;
        }
        Ok(())
    }
}
