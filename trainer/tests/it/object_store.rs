//! Data in object storage, against a real S3-compatible server: MinIO (built by `make minio-bin`,
//! found through $TANDEM_MINIO or scripts/minio/bin-path.sh) started on loopback for each test,
//! with the credentials in the environment of the `tandem` processes. The digits, written as
//! image files and packed into shards by `tandem data pack`, are copied into a bucket by `tandem
//! data upload`, counted by `tandem data inspect` and trained on by `tandem train` to the
//! accuracy of the same files on a local path; a missing bucket, wrong credentials, an empty
//! prefix and missing credentials each give an error that names the URL and the fix.
//!
//! Compiled with the trainer's `cluster-tests` feature (`make test` turns it on).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::{data_pipeline, image_data, trainer_support};

const BUCKET: &str = "tandem-data";
const USER: &str = "tandem-test";
const SECRET: &str = "tandem-test-secret";

/// The MinIO binary: $TANDEM_MINIO, else where scripts/minio/build.sh puts it.
fn minio_bin() -> PathBuf {
    let bin = match std::env::var_os("TANDEM_MINIO").filter(|v| !v.is_empty()) {
        Some(b) => PathBuf::from(b),
        None => {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/minio/bin-path.sh");
            let out = Command::new(&script).output().unwrap();
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        }
    };
    assert!(bin.exists(), "{} is missing: build the test S3 server with `make minio-bin`", bin.display());
    bin
}

/// A MinIO server on loopback with its data in a temporary folder; stopped when dropped.
struct Minio {
    child: Child,
    dir: tempfile::TempDir,
    endpoint: String,
}

impl Minio {
    /// Starts a server whose buckets are `buckets` (made as folders of its drive before it starts,
    /// which MinIO serves as buckets).
    fn start(buckets: &[&str]) -> Minio {
        let dir = tempfile::tempdir().unwrap();
        let drive = dir.path().join("drive");
        for b in buckets {
            std::fs::create_dir_all(drive.join(b)).unwrap();
        }
        let ports = tandem_util::proc::free_ports(2).unwrap();
        let (port, console) = (ports[0], ports[1]);
        let log = std::fs::File::create(dir.path().join("minio.log")).unwrap();
        let child = Command::new(minio_bin())
            .arg("server")
            .arg(&drive)
            .args(["--address", &format!("127.0.0.1:{port}"), "--console-address"])
            .arg(format!("127.0.0.1:{console}"))
            .arg("--certs-dir")
            .arg(dir.path().join("certs"))
            .env("MINIO_ROOT_USER", USER)
            .env("MINIO_ROOT_PASSWORD", SECRET)
            .env("MINIO_BROWSER", "off")
            .env("HOME", dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut minio = Minio { child, dir, endpoint: format!("http://127.0.0.1:{port}") };
        minio.wait_ready(port);
        minio
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("minio.log")).unwrap_or_default()
    }

    fn wait_ready(&mut self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("minio exited ({status}) before it was ready:\n{}", self.log());
            }
            let live = TcpStream::connect(("127.0.0.1", port)).ok().and_then(|mut s| {
                s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
                s.write_all(
                    b"GET /minio/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
                )
                .ok()?;
                let mut head = [0u8; 12];
                s.read_exact(&mut head).ok()?;
                Some(head.ends_with(b"200"))
            });
            if live == Some(true) {
                return;
            }
            assert!(Instant::now() < deadline, "minio was not ready within 60 s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `tandem` with the server's credentials in its environment (and nothing else of AWS's).
    fn tandem(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tandem"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("AWS_") {
                c.env_remove(k);
            }
        }
        c.env("TANDEM_DATA_DIR", trainer_support::data_dir())
            .env("AWS_ACCESS_KEY_ID", USER)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .env("AWS_REGION", "us-east-1");
        c
    }

    /// [`Minio::tandem`] with the endpoint in AWS_ENDPOINT_URL too (how `tandem data` finds it).
    fn tandem_data(&self) -> Command {
        let mut c = self.tandem();
        c.env("AWS_ENDPOINT_URL", &self.endpoint).arg("data");
        c
    }
}

impl Drop for Minio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_ok(c: &mut Command) -> String {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{c:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `c`, which must fail; returns its stderr.
fn run_err(c: &mut Command) -> String {
    let out: Output = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "{c:?} should have failed; stdout: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    stderr
}

/// Trains the job `name` of `manifest` with `c` (`tandem` with its environment); returns the
/// finished line.
fn train(mut c: Command, dir: &Path, name: &str, manifest: &str) -> serde_json::Value {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, manifest).unwrap();
    let stdout = run_ok(
        c.args(["train", "-f"]).arg(&file).args(["--output", "json", "--output-dir"]).arg(dir.join(name)),
    );
    let last = stdout.lines().last().unwrap();
    let finished: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(finished["event"], "finished", "{last}");
    finished
}

/// The line of `text` that starts with `prefix`.
fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
    text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no {prefix:?} line in:\n{text}"))
}

#[test]
fn shards_and_images_in_a_bucket_train_like_the_same_files_on_a_local_path() {
    let minio = Minio::start(&[BUCKET]);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("digits");
    image_data::digits_folder(&root);
    let packed = dir.path().join("shards");
    run_ok(minio.tandem().args(["data", "pack"]).arg(&root).arg(&packed).args(["--shard-size", "8K"]));
    let shards_url = format!("s3://{BUCKET}/digits/shards");
    let images_url = format!("s3://{BUCKET}/digits/images");
    let said = run_ok(minio.tandem_data().arg("upload").arg(&packed).arg(&shards_url));
    let local_shards = std::fs::read_dir(&packed).unwrap().count();
    assert!(said.contains(&format!("uploaded {local_shards} file(s)")), "{said}");
    run_ok(minio.tandem_data().arg("upload").arg(&root).arg(&images_url));

    // inspect counts the same through the bucket as on the disk.
    let here = run_ok(minio.tandem_data().arg("inspect").arg(&packed));
    let there = run_ok(minio.tandem_data().arg("inspect").arg(format!("{shards_url}/")));
    for field in ["samples:", "classes:", "skipped:"] {
        assert_eq!(line(&here, field), line(&there, field), "{here}\n{there}");
    }
    let here = run_ok(minio.tandem_data().arg("inspect").arg(&root));
    let there = run_ok(minio.tandem_data().arg("inspect").arg(&images_url));
    for field in ["training samples:", "test samples:", "classes:", "skipped:"] {
        assert_eq!(line(&here, field), line(&there, field), "{here}\n{there}");
    }
    assert!(there.contains(&format!("{images_url}/train/0/")), "files are named by their URLs: {there}");

    // Training from the bucket (endpoint in the manifest, credentials in the environment) reaches
    // the accuracy of the same files on a local path.
    let count = |prefix: &str| {
        std::fs::read_dir(&packed)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with(prefix))
            .count()
    };
    let pattern =
        |base: &str, prefix: &str| format!("{base}/{prefix}-{{000000..{:06}}}.tar", count(prefix) - 1);
    let s3 = format!("s3: {{endpoint: '{}'}}", minio.endpoint);
    let local = packed.display().to_string();
    let runs = [
        (
            "local-shards",
            format!(
                "{{source: shards, path: '{}', testPath: '{}', batchSize: 32}}",
                pattern(&local, "train"),
                pattern(&local, "test")
            ),
        ),
        (
            "s3-shards",
            format!(
                "{{source: shards, path: '{}', testPath: '{}', batchSize: 32, {s3}}}",
                pattern(&shards_url, "train"),
                pattern(&shards_url, "test")
            ),
        ),
        ("local-images", format!("{{source: images, path: '{}', batchSize: 32}}", root.display())),
        ("s3-images", format!("{{source: images, path: '{images_url}', batchSize: 32, {s3}}}")),
    ];
    let finished: Vec<serde_json::Value> = runs
        .iter()
        .map(|(name, data)| train(minio.tandem(), dir.path(), name, &image_data::job(name, data)))
        .collect();
    let acc = |v: &serde_json::Value| v["test_accuracy"].as_f64().unwrap();
    for pair in finished.chunks(2) {
        let (local, remote) = (&pair[0], &pair[1]);
        assert!(acc(local) > 0.9, "{local}");
        assert_eq!(remote["steps"], local["steps"], "{remote} vs {local}");
        assert!((acc(remote) - acc(local)).abs() < 0.02, "{remote} vs the local files' {local}");
    }
}

#[test]
fn object_storage_errors_name_the_url_and_what_to_do() {
    let minio = Minio::start(&[BUCKET]);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("train-000000.tar"), b"").unwrap();
    run_ok(minio.tandem_data().arg("upload").arg(dir.path()).arg(format!("s3://{BUCKET}/some")));

    let inspect = |c: &mut Command, url: &str| run_err(c.arg("inspect").arg(url));
    let err = inspect(&mut minio.tandem_data(), "s3://no-such-bucket/shards/");
    assert!(
        err.contains("s3://no-such-bucket/shards") && err.contains("bucket no-such-bucket does not exist"),
        "{err}"
    );
    assert!(err.contains("create it, or correct the bucket in data.path"), "{err}");

    let err = inspect(&mut minio.tandem_data(), &format!("s3://{BUCKET}/nothing-here/"));
    assert!(err.contains(&format!("s3://{BUCKET}/nothing-here: no object under this prefix")), "{err}");
    assert!(err.contains("tandem data upload"), "{err}");

    let err = inspect(&mut minio.tandem_data(), &format!("s3://{BUCKET}/some/train-{{000000..000001}}.tar"));
    assert!(err.contains(&format!("no object s3://{BUCKET}/some/train-000001.tar")), "{err}");

    let err = inspect(
        minio.tandem_data().env("AWS_SECRET_ACCESS_KEY", "not-the-secret"),
        &format!("s3://{BUCKET}/some/"),
    );
    assert!(err.contains(&format!("s3://{BUCKET}/some")) && err.contains("access denied"), "{err}");
    assert!(err.contains("AWS_ACCESS_KEY_ID") && err.contains("s3:GetObject"), "{err}");

    let err = inspect(
        minio.tandem_data().env_remove("AWS_ACCESS_KEY_ID").env_remove("AWS_SECRET_ACCESS_KEY"),
        &format!("s3://{BUCKET}/some/"),
    );
    assert!(
        err.contains(&format!("no credentials for the S3-compatible store at {}", minio.endpoint)),
        "{err}"
    );

    // `tandem train` says the same, before it trains anything.
    let file = dir.path().join("missing.yaml");
    let data = format!(
        "{{source: images, path: 's3://no-such-bucket/images', s3: {{endpoint: '{}'}}}}",
        minio.endpoint
    );
    std::fs::write(&file, image_data::job("missing", &data)).unwrap();
    let err = run_err(
        minio.tandem().args(["train", "-f"]).arg(&file).arg("--output-dir").arg(dir.path().join("out")),
    );
    assert!(err.contains("bucket no-such-bucket does not exist"), "{err}");
}

/// A small GPT on `data` (a `source: text` spec) for 150 steps.
fn text_job(name: &str, data: &str) -> String {
    data_pipeline::gpt_job(name, data, 150)
}

#[test]
fn a_text_and_a_table_in_a_bucket_train_like_the_same_files_on_a_local_path() {
    let minio = Minio::start(&[BUCKET]);
    let dir = tempfile::tempdir().unwrap();
    // A text in two files (read in name order), regular enough that a small GPT learns it.
    let books = dir.path().join("books");
    std::fs::create_dir_all(&books).unwrap();
    for (file, animals) in [("a.txt", ["cat", "dog"]), ("b.txt", ["owl", "fox"])] {
        let text: String = (0..300).map(|i| format!("the {} sat on the mat.\n", animals[i % 2])).collect();
        std::fs::write(books.join(file), text).unwrap();
    }
    let text_url = format!("s3://{BUCKET}/books");
    run_ok(minio.tandem_data().arg("upload").arg(&books).arg(&text_url));
    // A table: the digits' CSV, gzip-compressed as the data folder holds it.
    let csv = trainer_support::data_dir().join("digits.csv.gz");
    let csv_url = format!("s3://{BUCKET}/tables");
    run_ok(minio.tandem_data().arg("upload").arg(&csv).arg(&csv_url));

    let s3 = format!("s3: {{endpoint: '{}'}}", minio.endpoint);
    let run = |name: &str, manifest: String| train(minio.tandem(), dir.path(), name, &manifest);
    let text = |path: &str, extra: &str| {
        format!("{{source: text, path: '{path}', tokens: characters, batchSize: 16{extra}}}")
    };
    let table = |path: &str, extra: &str| format!("{{source: path, path: '{path}', batchSize: 32{extra}}}");
    let local_text = run("local-text", text_job("local-text", &text(&books.display().to_string(), "")));
    let s3_text = run("s3-text", text_job("s3-text", &text(&text_url, &format!(", {s3}"))));
    // The CSV's pixels are 0..16 as they are (no scaling): a smaller step than the images' jobs.
    let table_job = |name: &str, data: String| {
        image_data::job(name, &data).replace("learningRate: 0.1", "learningRate: 0.01")
    };
    let local_table = run("local-table", table_job("local-table", table(&csv.display().to_string(), "")));
    let s3_table = run(
        "s3-table",
        table_job("s3-table", table(&format!("{csv_url}/digits.csv.gz"), &format!(", {s3}"))),
    );

    let acc = |v: &serde_json::Value| v["test_accuracy"].as_f64().unwrap();
    // Next-character accuracy of the regular text: guessing over its ~20 characters gets ~0.05.
    assert!(acc(&local_text) > 0.6, "{local_text}");
    assert!(acc(&local_table) > 0.5, "{local_table}");
    for (local, remote) in [(&local_text, &s3_text), (&local_table, &s3_table)] {
        assert_eq!(remote["steps"], local["steps"], "{remote} vs {local}");
        assert!((acc(remote) - acc(local)).abs() < 0.02, "{remote} vs the local files' {local}");
    }

    // A text or table that is not in the bucket is named, with what to do.
    let missing = format!("s3://{BUCKET}/books/c.txt");
    let file = dir.path().join("missing.yaml");
    std::fs::write(&file, text_job("missing", &text(&missing, &format!(", {s3}")))).unwrap();
    let err = run_err(
        minio.tandem().args(["train", "-f"]).arg(&file).arg("--output-dir").arg(dir.path().join("m")),
    );
    assert!(err.contains(&missing) && err.contains("no such file or folder"), "{err}");
}

/// A running `tandem train --output json` of `manifest` into `out`, its events read as they come.
struct Running {
    child: Child,
    events: std::sync::mpsc::Receiver<serde_json::Value>,
}

impl Running {
    fn start(mut c: Command, manifest: &Path, out: &Path) -> Running {
        use std::io::BufRead;
        let mut child = c
            .args(["train", "--output", "json", "--device", "cpu", "-f"])
            .arg(manifest)
            .arg("--output-dir")
            .arg(out)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(out.with_extension("stderr")).unwrap())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, events) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(event) = serde_json::from_str(&line)
                    && tx.send(event).is_err()
                {
                    break;
                }
            }
        });
        Running { child, events }
    }

    /// The first event that `wanted` accepts; panics after 4 minutes or when the run ends first.
    fn until(&mut self, what: &str, wanted: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        loop {
            match self.events.recv_timeout(Duration::from_secs(240)) {
                Ok(event) if wanted(&event) => return event,
                Ok(_) => {}
                Err(e) => panic!("no {what}: {e}"),
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The object names under `prefix` of `bucket` on the server's drive (MinIO keeps an object as a
/// folder of its key).
fn objects(minio: &Minio, bucket: &str, prefix: &str) -> Vec<String> {
    let dir = minio.dir.path().join("drive").join(bucket).join(prefix);
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// Checkpoints in a bucket (`training.checkpoint.url`) outlive the output folder: a run killed
/// mid-way and started again with an empty output folder — a job deleted and re-created, a pod on
/// another node — resumes from the bucket, for an `allreduce` group's checkpoints (rank 0's) and
/// for a parameter server's shard alike; the bucket keeps what the folder keeps (pruned alike).
#[test]
fn checkpoints_in_a_bucket_outlive_the_output_folder_of_workers_and_parameter_servers() {
    let _one = crate::runner_support::one_job_at_a_time();
    let bucket = "tandem-checkpoints";
    let minio = Minio::start(&[bucket]);
    let dir = tempfile::tempdir().unwrap();
    // An allreduce group of two ranks (rank 0 checkpoints), the same job in one process (no
    // runner), and a PS job (its shard checkpoints; the workers continue from the PS's step).
    for (name, example, size, at_least) in [
        ("ckpt-allreduce", "mnist-allreduce.yaml", 2, 200),
        ("ckpt-single", "mnist-allreduce.yaml", 1, 200),
        ("ckpt-ps", "mnist-ps-sync.yaml", 1, 1),
    ] {
        let manifest =
            crate::runner_support::manifest_as(dir.path(), example, &format!("{name}.yaml"), |doc| {
                use crate::runner_support::set;
                set(doc, &["metadata", "name"], name.into());
                set(doc, &["spec", "workers", "groups"], 1.into());
                set(doc, &["spec", "workers", "groupSize"], size.into());
                set(doc, &["spec", "training", "steps"], 1500.into());
                let checkpoint = format!(
                    "{{everySteps: 100, url: 's3://{bucket}/runs', s3: {{endpoint: '{}'}}}}",
                    minio.endpoint
                );
                set(doc, &["spec", "training", "checkpoint"], serde_yaml::from_str(&checkpoint).unwrap());
            });
        let mut first = Running::start(minio.tandem(), &manifest, &dir.path().join(format!("{name}-1")));
        first.until("a step past 250", |e| e["event"] == "progress" && e["step"].as_u64() > Some(250));
        drop(first);

        let mut second = Running::start(minio.tandem(), &manifest, &dir.path().join(format!("{name}-2")));
        let resumed = second.until("a progress event", |e| e["event"] == "progress");
        let step = resumed["step"].as_u64().unwrap();
        assert!(
            step > at_least,
            "{name} started again at step {step}, not from its checkpoint in the bucket"
        );
        let finished = second.until("the end", |e| e["event"] == "finished");
        assert!(finished["test_accuracy"].as_f64().unwrap() > 0.8, "{finished}");
        assert!(second.child.wait().unwrap().success());
        let (prefix, checkpoint) = match name {
            "ckpt-ps" => (format!("runs/{name}/ps-0"), "shard-0-v"),
            _ => (format!("runs/{name}/checkpoints"), "ckpt-"),
        };
        let kept = objects(&minio, bucket, &prefix);
        assert!(
            !kept.is_empty() && kept.len() <= 3 && kept.iter().all(|k| k.starts_with(checkpoint)),
            "{name}: the bucket holds {kept:?} under {prefix}, not the folder's pruned checkpoints"
        );
    }
}
