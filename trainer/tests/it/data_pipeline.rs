//! The image pipeline as a user relies on it: batches do not depend on the decoding threads,
//! augmentation is reproducible, an unreadable sample is skipped and counted, a stream resumed at
//! its cursor continues with the next unseen sample — in-process, and with real `tandem worker`
//! processes whose group is stopped by SIGTERM mid-epoch and restarted — and a text file trains a
//! small GPT.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tandem_api::{TextTokens, contract};
use tandem_input::augment::{Crop, Transform};
use tandem_input::images::{self, Sizing};
use tandem_input::{self as data, DataCursor, ImageFolder, Prep, ShardReader, ShardSet, Source};

use crate::preemption::{Worker, stopped_at};
use crate::ps_common::Job;

const SIDE: u32 = 4;

/// A 4 × 4 grey PNG whose first two pixels spell `id`.
fn numbered_png(id: u32) -> Vec<u8> {
    let mut pixels = vec![0u8; (SIDE * SIDE) as usize];
    pixels[0] = (id % 256) as u8;
    pixels[1] = (id / 256) as u8;
    let mut out = Vec::new();
    image::GrayImage::from_raw(SIDE, SIDE, pixels)
        .unwrap()
        .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

/// The ids of a batch of numbered samples.
fn ids(x: &[f32]) -> Vec<u32> {
    x.chunks((SIDE * SIDE) as usize)
        .map(|s| (s[0] * 255.0).round() as u32 + 256 * (s[1] * 255.0).round() as u32)
        .collect()
}

/// Writes `shards` tar files of `per` numbered samples (`<id>.png` + `<id>.cls`, class id % 3)
/// into `dir`; the samples at (shard, offset) in `corrupt` get bytes that are no image, under a
/// readable name, so that only decoding finds them out.
fn write_shards(dir: &Path, shards: usize, per: usize, corrupt: &[(usize, usize)]) -> String {
    std::fs::create_dir_all(dir).unwrap();
    for s in 0..shards {
        let file = std::fs::File::create(dir.join(format!("part-{s:03}.tar"))).unwrap();
        let mut tar = tar::Builder::new(file);
        for o in 0..per {
            let id = (s * per + o) as u32;
            let image = if corrupt.contains(&(s, o)) { b"not an image".to_vec() } else { numbered_png(id) };
            let class = (id % 3).to_string();
            for (name, bytes) in
                [(format!("{id:06}.png"), image), (format!("{id:06}.cls"), class.into_bytes())]
            {
                let mut h = tar::Header::new_ustar();
                h.set_size(bytes.len() as u64);
                h.set_mode(0o644);
                h.set_entry_type(tar::EntryType::Regular);
                tar.append_data(&mut h, &name, bytes.as_slice()).unwrap();
            }
        }
        tar.finish().unwrap();
    }
    dir.display().to_string()
}

/// Every batch of `source` from its cursor to the end of its epoch, as ids.
fn rest_of_epoch(source: &mut dyn Source) -> Vec<Vec<u32>> {
    let epoch = source.cursor().epoch;
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let mut out = Vec::new();
    while source.cursor().epoch == epoch {
        source.next_batch(&mut x, &mut y).unwrap();
        assert_eq!(y.len() * (SIDE * SIDE) as usize, x.len());
        out.push(ids(&x));
    }
    out
}

fn prep(threads: usize, transform: Transform) -> Prep {
    Prep { transform: Arc::new(transform), threads, prefetch: 2 }
}

#[test]
fn batches_and_augmentation_do_not_depend_on_the_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let location = write_shards(&dir.path().join("shards"), 4, 30, &[]);
    let set = ShardSet::open(&location, None).unwrap();
    let shape = set.shape;
    let augmented = Transform { crop: Crop::Pad(1), flip: true, seed: 5, ..Transform::plain(shape) };
    let run = |threads: usize, transform: &Transform| {
        let mut r =
            ShardReader::new(set.clone(), 8, 3, 1, 2).unwrap().with_prep(prep(threads, transform.clone()));
        let (mut x, mut y) = (Vec::new(), Vec::new());
        let mut all = Vec::new();
        for _ in 0..2 * r.batches_per_epoch() {
            r.next_batch(&mut x, &mut y).unwrap();
            all.push((x.clone(), y.clone()));
        }
        all
    };
    let one = run(1, &augmented);
    assert_eq!(one, run(3, &augmented), "3 threads give other batches than 1");
    let plain = run(2, &Transform::plain(shape));
    assert_ne!(one, plain, "the augmentation changed nothing");
    // Same samples in the same order: only the pixels moved.
    assert_eq!(
        one.iter().map(|(_, y)| y.clone()).collect::<Vec<_>>(),
        plain.iter().map(|(_, y)| y.clone()).collect::<Vec<_>>()
    );
    // The epochs draw differently: the same sample is not augmented the same way twice.
    let per_epoch = one.len() / 2;
    assert_ne!(one[..per_epoch], one[per_epoch..]);
}

#[test]
fn a_stream_resumed_at_its_cursor_sees_the_next_unseen_sample() {
    let dir = tempfile::tempdir().unwrap();
    // An unreadable sample early in every shard: 3 in each rank's run of 60, which has 4 to spare
    // (7 batches of 8).
    let location =
        write_shards(&dir.path().join("shards"), 6, 20, &[(0, 2), (1, 3), (2, 1), (3, 4), (4, 0), (5, 5)]);
    let set = ShardSet::open(&location, None).unwrap();
    assert_eq!(set.total(), 120, "the count pass does not decode: every sample counts");
    let (batch, world) = (8, 2);
    let mut seen = BTreeSet::new();
    for rank in 0..world {
        let mut straight = ShardReader::new(set.clone(), batch, 9, rank, world).unwrap();
        let whole = rest_of_epoch(&mut straight);
        assert_eq!(whole.len() as u64, straight.batches_per_epoch());
        // Its 3, and those of the next epoch that the prefetch may have met already.
        assert!(straight.skipped() >= 3, "rank {rank} skipped {}", straight.skipped());
        for k in 1..whole.len() {
            let mut first = ShardReader::new(set.clone(), batch, 9, rank, world).unwrap();
            let (mut x, mut y) = (Vec::new(), Vec::new());
            for _ in 0..k {
                first.next_batch(&mut x, &mut y).unwrap();
            }
            let cursor = first.cursor();
            // Through the checkpoint's encoding.
            let cursor: DataCursor = serde_json::from_str(&serde_json::to_string(&cursor).unwrap()).unwrap();
            let mut resumed = ShardReader::new(set.clone(), batch, 9, rank, world).unwrap();
            resumed.seek(cursor).unwrap();
            assert_eq!(rest_of_epoch(&mut resumed), whole[k..], "rank {rank} resumed after batch {k}");
        }
        for id in whole.concat() {
            assert!(seen.insert(id), "sample {id} seen twice in the epoch");
        }
    }
    let corrupt: BTreeSet<u32> = [2, 23, 41, 64, 80, 105].into();
    assert!(seen.is_disjoint(&corrupt));

    // An image folder: the same.
    let root = dir.path().join("folder");
    for id in 0..90u32 {
        let class = root.join(format!("c{}", id % 3));
        std::fs::create_dir_all(&class).unwrap();
        let bytes = if id % 17 == 5 { b"garbage".to_vec() } else { numbered_png(id) };
        std::fs::write(class.join(format!("{id:04}.png")), bytes).unwrap();
    }
    std::fs::write(root.join("c0/0003.png"), &numbered_png(3)[..40]).unwrap();
    let folder = images::open(&root, None, Sizing::Own).unwrap();
    let batch = 4;
    for rank in 0..world {
        let mut straight = ImageFolder::new(folder.train.clone(), batch, 4, rank, world).unwrap();
        let whole = rest_of_epoch(&mut straight);
        let flat = whole.concat();
        assert_eq!(flat.iter().collect::<BTreeSet<_>>().len(), flat.len(), "rank {rank}: a file twice");
        for k in [1, whole.len() / 2, whole.len() - 1] {
            let mut first = ImageFolder::new(folder.train.clone(), batch, 4, rank, world).unwrap();
            let (mut x, mut y) = (Vec::new(), Vec::new());
            for _ in 0..k {
                first.next_batch(&mut x, &mut y).unwrap();
            }
            let mut resumed = ImageFolder::new(folder.train.clone(), batch, 4, rank, world).unwrap();
            resumed.seek(first.cursor()).unwrap();
            assert_eq!(rest_of_epoch(&mut resumed), whole[k..], "rank {rank} resumed after batch {k}");
        }
    }
}

/// When the job's epoch plan gives a rank another share from an epoch on (groups were added or
/// removed), the image sources serve from there what a source opened on that share serves, and a
/// share the data cannot fill is refused, naming the data.
#[test]
fn an_image_source_given_another_share_at_an_epoch_serves_that_shares_batches() {
    let dir = tempfile::tempdir().unwrap();
    let set = ShardSet::open(&write_shards(&dir.path().join("shards"), 6, 20, &[]), None).unwrap();
    let root = dir.path().join("folder");
    for id in 0..120u32 {
        let class = root.join(format!("c{}", id % 3));
        std::fs::create_dir_all(&class).unwrap();
        std::fs::write(class.join(format!("{id:04}.png")), numbered_png(id)).unwrap();
    }
    let folder = images::open(&root, None, Sizing::Own).unwrap().train;
    type Open = Box<dyn Fn(usize, usize) -> Box<dyn Source>>;
    let (shards, files) = (set.clone(), folder.clone());
    let kinds: [(&str, Open); 2] = [
        ("shards", Box::new(move |r, w| Box::new(ShardReader::new(shards.clone(), 4, 9, r, w).unwrap()))),
        ("images", Box::new(move |r, w| Box::new(ImageFolder::new(files.clone(), 4, 9, r, w).unwrap()))),
    ];
    for (kind, open) in &kinds {
        let mut source = open(0, 2);
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            source.next_batch(&mut x, &mut y).unwrap();
        }
        source.set_share(2, 3, DataCursor::at(1, 0)).unwrap();
        let mut fresh = open(2, 3);
        fresh.seek(DataCursor::at(1, 0)).unwrap();
        let want = rest_of_epoch(fresh.as_mut());
        assert_eq!(want.len() as u64, source.batches_per_epoch(), "{kind}");
        assert_eq!(rest_of_epoch(source.as_mut()), want, "{kind}: epoch 1 as rank 2 of 3");
        let err = source.set_share(0, 100, DataCursor::at(2, 0)).unwrap_err().to_string();
        assert!(err.contains("fewer than one batch"), "{kind}: {err}");
    }
}

/// The samples a worker's log says it served: (epoch, batch, ids), from its `tandem::samples`
/// trace lines.
fn served(log: &str) -> Vec<Served> {
    log.lines()
        .filter_map(|l| l.split_once("tandem::samples: ").map(|(_, rest)| rest))
        .map(|rest| {
            let words: Vec<&str> = rest.split_whitespace().collect();
            // "epoch E batch B served <shard>:<key> …"
            let (epoch, batch) = (words[1].parse().unwrap(), words[3].parse().unwrap());
            let ids = words[5..]
                .iter()
                .map(|name| name.rsplit_once(':').unwrap().1.parse::<u32>().unwrap())
                .collect();
            (epoch, batch, ids)
        })
        .collect()
}

#[test]
fn a_group_stopped_mid_epoch_and_restarted_sees_every_sample_of_the_epoch_once() {
    // The group resumes from rank 0's checkpoint, which holds every rank's cursor.
    stopped_mid_epoch_and_restarted("allreduce");
}

#[test]
fn a_ps_jobs_group_stopped_mid_epoch_and_restarted_sees_every_sample_of_the_epoch_once() {
    // The group resumes at the PS's clock; its ranks' cursors came with its last report.
    stopped_mid_epoch_and_restarted("ps-sync");
}

#[test]
fn a_ps_async_jobs_group_stopped_mid_epoch_and_restarted_trains_no_step_twice() {
    // The async shards' clocks do not count one group's steps: the group resumes after the last
    // step whose push every shard applied whole, not at its last report (up to 9 steps earlier),
    // and its ranks read their way there from that report's cursors.
    stopped_mid_epoch_and_restarted("ps-async");
}

/// A group of 2 `tandem worker`s on tar shards with unreadable samples early in each rank's run
/// (so each rank's stream is shifted), stopped by SIGTERM mid-epoch and restarted: the epoch's
/// batches are an uninterrupted run's, every readable sample seen once.
fn stopped_mid_epoch_and_restarted(algorithm: &str) {
    let _one = crate::runner_support::one_job_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    // 2 ranks × 1030 samples, batches of 8: 128 batches and 6 samples to spare per rank.
    let (shards, per, batch, seed) = (20usize, 103usize, 8usize, 21u64);
    let shard_dir = dir.path().join("shards");
    let location = write_shards(&shard_dir, shards, per, &[]);
    let set = ShardSet::open(&location, None).unwrap();
    // An unreadable sample early in each rank's run, and one more in rank 0's.
    let order = ShardReader::new(set.clone(), batch, seed, 0, 2).unwrap().shard_order(0);
    write_shards(&shard_dir, shards, per, &[(order[0], 1), (order[10], 2), (order[1], 7)]);
    let expected: Vec<Vec<Vec<u32>>> = (0..2)
        .map(|rank| rest_of_epoch(&mut ShardReader::new(set.clone(), batch, seed, rank, 2).unwrap()))
        .collect();
    let test = write_shards(&dir.path().join("test"), 1, 40, &[]);
    let replicas = u32::from(algorithm != "allreduce");
    let job = Job::with_spec(serde_json::json!({
        // Wide enough that a step takes milliseconds and the stop lands inside the first epoch.
        "model": {"kind": "mlp", "hidden": [1024, 1024]},
        "data": {"source": "shards", "path": location, "testPath": test, "batchSize": batch},
        "training": {
            "algorithm": algorithm,
            "steps": 140,
            "seed": seed,
            "evalEverySteps": 0,
            "optimizer": {"kind": "sgd", "learningRate": 0.01},
            "checkpoint": {"everySteps": 0}
        },
        "parameterServers": {"replicas": replicas},
        "workers": {"groups": 1, "groupSize": 2, "minGroups": 1, "maxGroups": 1, "backend": "tcp"}
    }));
    let ps: Vec<_> = (0..replicas).map(|i| job.spawn_ps(i, 0)).collect();
    let trace = [("RUST_LOG", "info,tandem::samples=trace")];
    job.write_topology(&ps, &[crate::ps_common::loopback_endpoints(2)]);
    let mut ranks = [Worker::spawn_with(&job, 0, 0, &trace), Worker::spawn_with(&job, 1, 0, &trace)];
    ranks[0].wait_for_progress();
    ranks[1].sigterm();
    for (r, w) in ranks.iter_mut().enumerate() {
        let status = w.wait(Duration::from_secs(120));
        assert_eq!(status.code(), Some(contract::EXIT_PREEMPTED), "rank {r}: {status:?}\n{}", w.log_text());
    }
    let step = stopped_at(&ranks[0].log_text());
    assert!(step < 128, "the stop should land inside the first epoch (128 steps), not at step {step}");
    let mut again = [Worker::spawn_with(&job, 0, 1, &trace), Worker::spawn_with(&job, 1, 1, &trace)];
    for (r, w) in again.iter_mut().enumerate() {
        let status = w.wait(Duration::from_secs(300));
        let ps_logs: String = ps.iter().map(|p| p.log_text()).collect();
        assert!(status.success(), "rank {r} of the restarted group: {status:?}\n{}\n{ps_logs}", w.log_text());
        assert_eq!(w.finished()["start_step"].as_u64(), Some(step));
    }
    let mut seen = BTreeSet::new();
    for rank in 0..2 {
        // What the steps trained on: the first attempt's batches up to the stop, then the restart's.
        let first: Vec<Served> = served(&ranks[rank].log_text());
        let mut second = served(&again[rank].log_text());
        assert_eq!(first.len() as u64, step, "rank {rank}: one batch per completed step");
        // A PS job's restarted rank reads its way from its last report's cursor to the step: those
        // batches are the ones the first attempt trained on, read again, not trained again.
        let read_ahead = second.iter().take_while(|b| b.0 == 0 && b.1 < step).count();
        for b in second.drain(..read_ahead) {
            assert_eq!(
                first[b.1 as usize], b,
                "rank {rank}: a batch read ahead differs from the one trained"
            );
        }
        assert_eq!(second.first().map(|b| (b.0, b.1)), Some((0, step)), "rank {rank} resumes at its batch");
        let epoch0: Vec<Vec<u32>> =
            first.iter().chain(&second).filter(|b| b.0 == 0).map(|b| b.2.clone()).collect();
        assert_eq!(
            epoch0, expected[rank],
            "rank {rank}: the epoch's batches differ from an uninterrupted run"
        );
        for id in epoch0.concat() {
            assert!(seen.insert(id), "sample {id} seen twice in epoch 0");
        }
        assert_eq!(first.len() + second.len(), 140, "rank {rank}: one batch per step of the job");
    }
    // Every readable sample of the epoch's runs, none left out, none twice: 2 × 128 × 8.
    assert_eq!(seen.len(), 2 * 128 * batch);
    assert!(ranks[0].log_text().contains("skipping unreadable image"), "{}", ranks[0].log_text());
    assert!(ranks[0].log_text().contains(".tar:"), "the warning names the shard and the sample");
}

fn text_job(dir: &Path, name: &str, path: &Path, tokens: &str, steps: u64) -> PathBuf {
    let file = dir.join(format!("{name}.yaml"));
    let data = format!("{{source: text, path: {}, tokens: {tokens}, batchSize: 16}}", path.display());
    std::fs::write(&file, gpt_job(name, &data, steps)).unwrap();
    file
}

/// The manifest of a one-rank job training a small GPT (1 layer, width 32, context 16) on `data`
/// for `steps` steps.
pub(crate) fn gpt_job(name: &str, data: &str, steps: u64) -> String {
    format!(
        "apiVersion: tandem.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  model: {{kind: gpt, layers: 1, heads: 2, dim: 32, context: 16}}
  data: {data}
  training:
    algorithm: allreduce
    optimizer: {{kind: adamw, learningRate: 0.01}}
    steps: {steps}
    evalEverySteps: 0
  workers: {{groups: 1, groupSize: 1, minGroups: 1, maxGroups: 1}}
"
    )
}

#[test]
fn a_small_gpt_learns_a_text_file_and_bad_texts_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    // A regular text: after a few characters of a line the rest is determined.
    let mut text = String::new();
    for i in 0..600 {
        let animal = ["cat", "dog", "owl", "fox"][i % 4];
        text.push_str(&format!("the {animal} sat on the mat. é\n"));
    }
    let book = dir.path().join("book.txt");
    std::fs::write(&book, &text).unwrap();
    let (tokens, vocab) = data::text::read_text(&book, TextTokens::Characters).unwrap();
    assert_eq!(tokens.len(), text.chars().count());
    let distinct: BTreeSet<char> = text.chars().collect();
    assert_eq!(vocab, distinct.len(), "the vocabulary is the text's distinct characters");
    let (bytes, byte_vocab) = data::text::read_text(&book, TextTokens::Bytes).unwrap();
    assert_eq!((bytes.len(), byte_vocab), (text.len(), 256));

    let file = text_job(dir.path(), "book", &book, "characters", 300);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["train", "-f"])
        .arg(&file)
        .args(["--output", "json", "--output-dir"])
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let finished: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let accuracy = finished["test_accuracy"].as_f64().unwrap();
    // Uniform guessing over the vocabulary gets 1/vocab (≈ 0.05); the text's structure ≥ 0.6.
    assert!(accuracy > 0.6, "next-character accuracy {accuracy} on a regular text: {finished}");

    // Missing, empty, not UTF-8: each named, with what to do.
    let missing =
        data::text::read_text(&dir.path().join("nope.txt"), TextTokens::Bytes).unwrap_err().to_string();
    assert!(missing.contains("nope.txt") && missing.contains("no such file"), "{missing}");
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("a.txt"), "").unwrap();
    let err = data::text::read_text(&empty, TextTokens::Bytes).unwrap_err().to_string();
    assert!(err.contains("the text is empty"), "{err}");
    let latin1 = dir.path().join("latin1.txt");
    std::fs::write(&latin1, b"first line\nsecond caf\xe9 line\n").unwrap();
    let err = data::text::read_text(&latin1, TextTokens::Characters).unwrap_err().to_string();
    assert!(err.contains("latin1.txt") && err.contains("line 2") && err.contains("not UTF-8"), "{err}");
    // Through `tandem train`, before any training.
    let file = text_job(dir.path(), "latin", &latin1, "bytes", 10);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["train", "-f"])
        .arg(&file)
        .args(["--output-dir"])
        .arg(dir.path().join("latin-out"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("not UTF-8"), "{stderr}");
}

/// `kubectl scale` up on a PS job: two groups of `tandem worker` train tar shards in epochs, a
/// third is added once the first epoch is planned (the config rewritten as the operator rewrites
/// its ConfigMap). Each epoch is split over the groups the job's plan fixed for it: every sample
/// of an epoch's share is seen once, by one group, and each group runs its shares' steps.
#[test]
fn a_ps_job_scaled_up_splits_each_epoch_over_its_planned_groups_and_sees_each_sample_once() {
    let run = scaled(2, 3);
    assert_eq!(run.plan[0], 2, "epoch 0 was planned before the scaling: {:?}", run.plan);
    assert!(
        run.plan.contains(&3),
        "the epochs planned after the config said 3 groups are split over 3 (did the two groups take \
         the whole run before the third started?): {:?}",
        run.plan
    );
    run.check_epochs(0);
}

/// `kubectl scale` down: of three groups the third is stopped once the first epoch is planned,
/// and the config says two. The epochs planned after that are split over the two left, every
/// sample of each seen once; the stopped group's share of the epochs planned with it is lost.
#[test]
fn a_ps_job_scaled_down_splits_the_epochs_planned_after_over_the_groups_left() {
    let run = scaled(3, 2);
    let first = run.plan.iter().position(|&g| g == 2).unwrap_or(run.plan.len());
    assert!(
        (1..=2).contains(&first) && run.plan[first..].iter().all(|&g| g == 2),
        "epoch 0 (and the next, if the stopped group planned it before it stopped) over 3, every \
         later one over 2: {:?}",
        run.plan
    );
    run.check_epochs(first);
}

/// A batch a worker served: (epoch, batch, sample ids).
type Served = (u64, u64, Vec<u32>);

/// What a scaled run left: the epoch plan, and what each group served and ran.
struct Scaled {
    plan: Vec<u64>,
    /// Per group: (epoch, batch, ids) of each batch it served, and its `finished` line (`None`
    /// for a group that was stopped).
    groups: Vec<(Vec<Served>, Option<serde_json::Value>)>,
}

// 960 samples in batches of 8: 60 batches an epoch on each of 2 ranks, 40 on each of 3.
const SCALED_SAMPLES: u64 = 960;
const SCALED_BATCH: u64 = 8;
const SCALED_EPOCHS: u64 = 5;

/// A 5-epoch ps-async job on tar shards, groups of one rank, started with `from` groups and
/// scaled to `to` once epoch 0 is planned: groups added are started, groups removed stopped
/// (SIGTERM) before the config says `to`.
fn scaled(from: u32, to: u32) -> Scaled {
    let _one = crate::runner_support::one_job_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let location = write_shards(&dir.path().join("shards"), 20, (SCALED_SAMPLES / 20) as usize, &[]);
    let test = write_shards(&dir.path().join("test"), 1, 40, &[]);
    let job = Job::with_spec(serde_json::json!({
        // Wide enough that a step takes milliseconds: the scaling lands in the first epochs.
        "model": {"kind": "mlp", "hidden": [1024, 1024]},
        "data": {"source": "shards", "path": location, "testPath": test, "batchSize": SCALED_BATCH},
        "training": {
            "algorithm": "ps-async",
            "epochs": SCALED_EPOCHS,
            "evalEverySteps": 0,
            "optimizer": {"kind": "sgd", "learningRate": 0.01},
            "checkpoint": {"everySteps": 0}
        },
        "parameterServers": {"replicas": 1},
        "workers": {"groups": from, "groupSize": 1, "minGroups": 1, "maxGroups": 3, "backend": "tcp"}
    }));
    let ps = [job.spawn_ps(0, 0)];
    let topology = |n: u32| (0..n).map(|_| crate::ps_common::loopback_endpoints(1)).collect::<Vec<_>>();
    job.write_topology(&ps, &topology(from.max(to)));
    let trace = [("RUST_LOG", "info,tandem::samples=trace")];
    let mut groups: Vec<Worker> = (0..from).map(|g| Worker::spawn_in(&job, g, 0, 0, &trace)).collect();
    let mut observer = job.observer(&crate::ps_common::addrs(&ps));
    let plan = |observer: &mut tandem_ps::client::PsClient| -> Vec<u64> {
        let status = observer.status(0).unwrap();
        status["epochs"].as_array().map(|e| e.iter().filter_map(|g| g.as_u64()).collect()).unwrap_or_default()
    };
    crate::ps_common::eventually("the first epoch to be planned", || !plan(&mut observer).is_empty());
    let mut stopped = Vec::new();
    for g in (to..from).rev() {
        let mut w = groups.pop().unwrap();
        // Training (its SIGTERM handler in place), then stopped as the kubelet stops a pod.
        w.wait_for_progress();
        w.sigterm();
        let status = w.wait(Duration::from_secs(120));
        assert_eq!(status.code(), Some(contract::EXIT_PREEMPTED), "group {g}: {status:?}\n{}", w.log_text());
        stopped.push(w);
    }
    let path = job.dir.path().join("job.json");
    let mut config = contract::JobConfig::from_json(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config.spec.workers.groups = to;
    std::fs::write(&path, config.to_json()).unwrap();
    groups.extend((from..to).map(|g| Worker::spawn_in(&job, g, 0, 0, &trace)));
    for (g, w) in groups.iter_mut().enumerate() {
        let status = w.wait(Duration::from_secs(300));
        assert!(status.success(), "group {g}: {status:?}\n{}", w.log_text());
    }
    let plan = plan(&mut observer);
    assert_eq!(plan.len() as u64, SCALED_EPOCHS, "every epoch planned: {plan:?}");
    let mut out: Vec<_> = groups.iter().map(|w| (served(&w.log_text()), Some(w.finished()))).collect();
    out.extend(stopped.iter().rev().map(|w| (served(&w.log_text()), None)));
    Scaled { plan, groups: out }
}

impl Scaled {
    /// Every epoch: no sample twice, no group outside the epoch's plan served in it, and from
    /// epoch `whole` on every group of the plan served its whole share; every group that finished
    /// ran its shares' steps.
    fn check_epochs(&self, whole: usize) {
        let plan = &self.plan;
        let per_epoch = |g: u64| SCALED_SAMPLES / g / SCALED_BATCH;
        for (e, &planned) in plan.iter().enumerate() {
            let mut seen = BTreeSet::new();
            for (g, (batches, finished)) in self.groups.iter().enumerate() {
                let mine: Vec<_> = batches.iter().filter(|b| b.0 == e as u64).collect();
                let share = if (g as u64) < planned { per_epoch(planned) } else { 0 };
                if finished.is_some() {
                    assert_eq!(mine.len() as u64, share, "group {g}, epoch {e} of plan {plan:?}");
                } else {
                    assert!(mine.len() as u64 <= share, "stopped group {g}, epoch {e} of plan {plan:?}");
                }
                for id in mine.iter().flat_map(|b| b.2.iter()) {
                    assert!(seen.insert(*id), "sample {id} seen twice in epoch {e} (plan {plan:?})");
                }
            }
            if e >= whole {
                let all = per_epoch(planned) * planned * SCALED_BATCH;
                assert_eq!(seen.len() as u64, all, "epoch {e}: every share trained (plan {plan:?})");
            }
        }
        for (g, (_, finished)) in self.groups.iter().enumerate() {
            let Some(finished) = finished else { continue };
            let own: u64 = plan.iter().filter(|&&p| (g as u64) < p).map(|&p| per_epoch(p)).sum();
            assert_eq!(finished["steps"].as_u64(), Some(own), "group {g} runs its shares of plan {plan:?}");
        }
    }
}
