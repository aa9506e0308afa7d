//! A user's own worker processes (`spec.workers.command`) under the local runner: each rank is
//! the user's command, started with the launch contract for user processes
//! ([`tandem_api::contract::user`]), and its group's progress comes from the JSON lines the
//! process appends to `TANDEM_PROGRESS_FILE`.
//!
//! Expected flow: [`check`] refuses what the runner cannot run; [`command`] builds a rank's
//! process; [`tail_progress`] follows the progress file of a group's attempt, from its rank 0's
//! start until that process ended, and hands every line to the supervisor as the group's
//! progress, as `tandem worker`'s stdout lines are.
//!
//! Guarantees: every rank of a group runs on this host (`LOCAL_RANK` is the rank), or, placed on
//! nodes (`--node`), inside its node's network namespace at the node's address, one rank per host
//! as a pod would be (`LOCAL_RANK` 0, `GROUP_RANK` the rank, the node as its host identity and
//! gloo's interface, so its group's traffic crosses the links); the command runs in the manifest's folder, so a relative script path names the file beside the manifest;
//! the rank's stdout and stderr both go to its log; a new attempt starts with an empty progress
//! file, so no line of an earlier attempt or run is read as this one's.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use tandem_api::TrainingJobSpec;
use tandem_api::contract::user::{self, Hosting, UserFiles, UserProgress};
use tandem_api::contract::{JobConfig, LaunchEnv};
use tandem_api::job::Backend;

use super::nodes::Node;
use super::progress::Line;
use super::state::ProcId;
use super::{RunnerError, io};

/// How often a progress file is read for new lines.
const POLL: Duration = Duration::from_millis(200);

/// Refuses a user-command job the local runner cannot run, saying what to change; `local` is
/// whether every process stays on this machine's loopback (no `--node`).
pub fn check(spec: &TrainingJobSpec, local: bool) -> Result<(), RunnerError> {
    if spec.workers.command.is_some() && !local && spec.workers.backend == Backend::Mpi {
        return Err(RunnerError::Config(
            "--node places each rank of a workers.command job on a node, but an `mpi` group's mpirun starts              its ranks on the launcher's: use `workers.backend: tcp` with --node, or leave out --node"
                .into(),
        ));
    }
    Ok(())
}

/// The files of rank `launch`'s group in its attempt, under the job's output folder.
pub fn files(output: &Path, group: u32, attempt: u32, data_dir: &Path) -> UserFiles {
    UserFiles {
        checkpoint_dir: user::checkpoint_dir(output, group),
        progress_file: user::progress_file(output, group, attempt),
        data_dir: Some(data_dir.to_path_buf()),
    }
}

/// The process of one rank: the user's command and args, in `workdir`, with the contract's
/// variables, the job's `workers.env`, and `threads` compute threads unless the environment says.
pub fn command(
    spec: &TrainingJobSpec,
    config: &JobConfig,
    launch: &LaunchEnv,
    files: &UserFiles,
    workdir: &Path,
    threads: usize,
    node: Option<&Node>,
) -> Result<Command, RunnerError> {
    let Some((program, rest)) = spec.workers.command.as_deref().and_then(<[String]>::split_first) else {
        return Err(RunnerError::Config("workers.command is empty: name the program to run".into()));
    };
    let hosting = if node.is_some() { Hosting::HostPerRank } else { Hosting::OneHost };
    let vars =
        user::user_env(config, launch, hosting, files).map_err(|e| RunnerError::Config(e.to_string()))?;
    create_dirs(files)?;
    let mut cmd = match node {
        Some(node) => {
            let mut cmd = node.command(program);
            // gloo takes the address the host name resolves to, loopback in a namespace (a pod
            // resolves its own): name the node's interface, unless workers.env does.
            if let Some(interface) = node.interface() {
                cmd.env("GLOO_SOCKET_IFNAME", interface);
            }
            cmd
        }
        None => Command::new(program),
    };
    cmd.args(rest).args(spec.workers.args.iter().flatten()).current_dir(workdir);
    limit_threads(&mut cmd, threads);
    cmd.envs(spec.workers.env.iter().flatten().map(|e| (&e.name, &e.value)));
    cmd.envs(vars);
    Ok(cmd)
}

/// Creates the group's checkpoint folder and its progress file's folder.
pub fn create_dirs(files: &UserFiles) -> Result<(), RunnerError> {
    for dir in [&files.checkpoint_dir, &parent(&files.progress_file)] {
        std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    }
    Ok(())
}

/// Gives `cmd` `threads` compute threads unless the environment says: every rank shares this
/// machine's cores, and PyTorch and OpenMP size their pools to all of them.
pub fn limit_threads(cmd: &mut Command, threads: usize) {
    for key in ["OMP_NUM_THREADS", "MKL_NUM_THREADS"] {
        if std::env::var_os(key).is_none() {
            cmd.env(key, threads.to_string());
        }
    }
}

fn parent(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Empties `path`, the progress file of an attempt about to start.
pub fn reset_progress(path: &Path) -> Result<(), RunnerError> {
    std::fs::create_dir_all(parent(path)).map_err(io(format!("creating {}", parent(path).display())))?;
    std::fs::File::create(path).map_err(io(format!("creating {}", path.display())))?;
    Ok(())
}

/// Follows `path` on a thread of its own, sending each complete progress line as `group`'s
/// progress from process `id`, until `ended` is set (then it reads what is left, sets `drained`
/// and stops) or the receiver is gone.
pub fn tail_progress(
    path: PathBuf,
    group: u32,
    id: ProcId,
    (ended, drained): (Arc<AtomicBool>, Arc<AtomicBool>),
    lines: mpsc::Sender<(ProcId, Line)>,
) {
    std::thread::spawn(move || {
        let mut tail = LineTail::new(path);
        loop {
            // Read after looking at the flag: once it is set, this read sees every line written.
            let last = ended.load(Ordering::SeqCst);
            let mut receiver_gone = false;
            tail.read(|text| {
                if let Some(line) = to_line(group, text) {
                    receiver_gone |= lines.send((id, line)).is_err();
                }
            });
            if last || receiver_gone {
                drained.store(true, Ordering::SeqCst);
                return;
            }
            std::thread::sleep(POLL);
        }
    });
}

/// A file that another process appends lines to, read as it grows: the offset read up to and an
/// incomplete last line. Each read hands on the complete lines written since the last one.
pub struct LineTail {
    path: PathBuf,
    offset: u64,
    pending: Vec<u8>,
}

impl LineTail {
    /// Reads `path` from its start; a file that does not exist yet reads as empty.
    pub fn new(path: PathBuf) -> Self {
        Self { path, offset: 0, pending: Vec::new() }
    }

    /// Calls `each` with every complete line written since the last read, without its newline.
    pub fn read(&mut self, mut each: impl FnMut(&str)) {
        if let Ok(mut file) = std::fs::File::open(&self.path)
            && file.seek(SeekFrom::Start(self.offset)).is_ok()
            && let Ok(n) = file.read_to_end(&mut self.pending)
        {
            self.offset += n as u64;
        }
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            each(&String::from_utf8_lossy(&self.pending[..end]));
            self.pending.drain(..=end);
        }
    }
}

/// A progress line of the user's process as the supervisor's [`Line::Progress`] of `group`.
pub fn to_line(group: u32, text: &str) -> Option<Line> {
    let p = UserProgress::parse(text)?;
    Some(Line::Progress {
        group,
        step: p.step,
        loss: p.loss,
        accuracy: p.accuracy,
        samples: p.samples.unwrap_or(0),
        data_wait: 0.0,
        skipped: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_become_the_groups_progress() {
        assert_eq!(
            to_line(1, r#"{"step":40,"loss":0.5,"accuracy":0.8,"samples":2560}"#),
            Some(Line::Progress {
                group: 1,
                step: 40,
                loss: Some(0.5),
                accuracy: Some(0.8),
                samples: 2560,
                data_wait: 0.0,
                skipped: 0
            })
        );
        assert_eq!(to_line(0, "epoch 3 done"), None);
    }

    #[test]
    fn a_followed_file_yields_complete_lines_until_its_process_ended() {
        let dir = std::env::temp_dir().join(format!("tandem-tail-{}", std::process::id()));
        let path = dir.join("group-0.0.jsonl");
        reset_progress(&path).unwrap();
        let (ended, drained) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (tx, rx) = mpsc::channel();
        tail_progress(path.clone(), 0, 7, (ended.clone(), drained.clone()), tx);
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new().append(true).open(&path).unwrap();
        file.write_all(b"{\"step\":1}\nnot json\n{\"step\":2,").unwrap();
        file.flush().unwrap();
        let (id, first) = rx.recv().unwrap();
        assert_eq!(id, 7);
        assert!(matches!(first, Line::Progress { step: 1, .. }), "{first:?}");
        file.write_all(b"\"loss\":0.25}\n").unwrap();
        ended.store(true, Ordering::SeqCst);
        let (_, second) = rx.recv().unwrap();
        assert!(matches!(second, Line::Progress { step: 2, loss: Some(l), .. } if l == 0.25), "{second:?}");
        // The thread stops once the process ended and the file is read: the channel closes, and
        // it said that every line was sent.
        assert!(rx.recv().is_err());
        assert!(drained.load(Ordering::SeqCst));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
