//! Image folders and tar shards as a user has them: the digits written as PNG and JPEG files by
//! the test, packed into shards by `tandem data pack`, counted by `tandem data inspect`, and
//! trained on by `tandem train` to the built-in source's accuracy; corrupt files and a truncated
//! shard are skipped, named and counted.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use tandem_api::{DataSource, DataSpec};
use tandem_input::images::{self, Sizing};
use tandem_input::shards::{self, ShardSet};
use tandem_input::{self as data, ShardReader, Source, Splits};

use crate::trainer_support;

fn tandem() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_tandem"));
    c.env("TANDEM_DATA_DIR", trainer_support::data_dir());
    c
}

fn run_ok(c: &mut Command) -> Output {
    let out = c.output().unwrap();
    assert!(out.status.success(), "{c:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Writes sample `i` of `data` (8×8 values in [0, 1]) as `<dir>/<class>/<i>.png` (even `i`) or
/// `.jpg` (odd `i`).
fn write_images(data: &data::Dataset, dir: &Path) {
    for i in 0..data.len() {
        let class = dir.join(format!("{}", data.targets(i)[0]));
        std::fs::create_dir_all(&class).unwrap();
        let pixels: Vec<u8> = data.sample(i).iter().map(|v| (v * 255.0).round() as u8).collect();
        let img =
            image::GrayImage::from_raw(data.shape.width as u32, data.shape.height as u32, pixels).unwrap();
        if i % 2 == 0 {
            img.save(class.join(format!("{i:05}.png"))).unwrap();
        } else {
            let mut f = std::fs::File::create(class.join(format!("{i:05}.jpg"))).unwrap();
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut f, 95).encode_image(&img).unwrap();
        }
    }
}

/// The built-in digits written as an image folder with `train/` and `test/` (the built-in's own
/// split), plus two broken files in class 3: one whose header is garbage and one cut in half.
pub(crate) fn digits_folder(root: &Path) -> Splits {
    let spec = DataSpec { source: DataSource::Digits, ..DataSpec::default() };
    let splits = data::load(&spec, &trainer_support::data_dir(), 1).unwrap();
    write_images(&splits.train, &root.join("train"));
    write_images(&splits.test, &root.join("test"));
    std::fs::write(root.join("train/3/corrupt.png"), b"this is not a PNG file at all").unwrap();
    let good = std::fs::read(
        root.join("train/3")
            .read_dir()
            .unwrap()
            .find_map(|e| {
                let p = e.unwrap().path();
                (p.extension().unwrap() == "png").then_some(p)
            })
            .unwrap(),
    )
    .unwrap();
    std::fs::write(root.join("train/3/truncated.png"), &good[..good.len() / 2]).unwrap();
    splits
}

pub(crate) fn job(name: &str, data: &str) -> String {
    format!(
        "apiVersion: tandem.dev/v1alpha1
kind: TrainingJob
metadata: {{name: {name}}}
spec:
  model: {{kind: mlp, hidden: [32]}}
  data: {data}
  training:
    algorithm: allreduce
    optimizer: {{kind: sgd, learningRate: 0.1, momentum: 0.9}}
    epochs: 4
    evalEverySteps: 0
  workers: {{groups: 1, groupSize: 1, minGroups: 1, maxGroups: 1}}
"
    )
}

/// Trains the job `name` on `data` with `tandem train`; returns the finished line and stderr.
fn train(dir: &Path, name: &str, data: &str) -> (serde_json::Value, String) {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, job(name, data)).unwrap();
    let out = run_ok(
        tandem()
            .args(["train", "-f"])
            .arg(&file)
            .args(["--output", "json", "--output-dir"])
            .arg(dir.join(name)),
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    let finished: serde_json::Value = serde_json::from_str(last).unwrap();
    assert_eq!(finished["event"], "finished", "{last}");
    (finished, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn image_folders_and_packed_shards_train_like_the_builtin_digits() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("digits");
    let splits = digits_folder(&root);
    let (train_n, test_n) = (splits.train.len(), splits.test.len());

    // inspect counts what is there: the corrupt file is skipped, the half file still lists.
    let out = run_ok(tandem().args(["data", "inspect"]).arg(&root));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("classes: 10 (0, 1, 2, 3, 4, 5, 6, 7, 8, 9)"), "{text}");
    assert!(text.contains(&format!("training samples: {}", train_n + 1)), "{text}");
    assert!(text.contains(&format!("test samples: {test_n}")), "{text}");
    assert!(text.contains("skipped: 1"), "{text}");
    assert!(text.contains("8×8"), "{text}");

    // pack into shards of about 8 KiB of images (several shards), then cut one in half.
    let packed = dir.path().join("shards");
    let out = run_ok(tandem().args(["data", "pack"]).arg(&root).arg(&packed).args(["--shard-size", "8K"]));
    let said = String::from_utf8(out.stdout).unwrap();
    assert!(said.contains(&format!("packed {} training samples", train_n + 1)), "{said}");
    let all = shards::shard_paths(packed.to_str().unwrap()).unwrap();
    let named = |prefix: &str| -> Vec<_> {
        all.iter().filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(prefix)).cloned().collect()
    };
    let (trains, tests) = (named("train-"), named("test-"));
    assert!(trains.len() >= 4, "{trains:?}");
    let whole =
        ShardSet::open(&format!("{}/train-{{000000..{:06}}}.tar", packed.display(), trains.len() - 1), None)
            .unwrap();
    assert_eq!(whole.total(), (train_n + 1) as u64);
    assert_eq!(whole.skipped, 0);
    let cut = &trains[1];
    let bytes = std::fs::read(cut).unwrap();
    // Into the middle of a member's data: the 11th member (the 6th sample's image).
    let mut archive = tar::Archive::new(std::io::Cursor::new(&bytes));
    let member = archive.entries().unwrap().nth(10).unwrap().unwrap();
    assert!(member.path().unwrap().to_str().unwrap().ends_with("g"), "an image member");
    let at = (member.raw_file_position() + member.size() / 2) as usize;
    drop(member);
    std::fs::write(cut, &bytes[..at]).unwrap();
    let pattern = format!("{}/train-{{000000..{:06}}}.tar", packed.display(), trains.len() - 1);
    let out = run_ok(tandem().args(["data", "inspect", &pattern]));
    let text = String::from_utf8(out.stdout).unwrap();
    let counted = ShardSet::open(&pattern, None).unwrap();
    assert_eq!(counted.skipped, 1, "the truncated member is counted");
    assert!(counted.total() < whole.total() && counted.total() > whole.total() - 100, "{}", counted.total());
    assert!(text.contains(&format!("samples: {}", counted.total())), "{text}");
    assert!(text.contains("skipped: 1"), "{text}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("truncated tar member"), "{:?}", out.stderr);

    // Training on each reaches the built-in source's accuracy.
    let (builtin, _) = train(dir.path(), "builtin", "{source: digits, batchSize: 32}");
    let (folder, folder_log) =
        train(dir.path(), "folder", &format!("{{source: images, path: {}, batchSize: 32}}", root.display()));
    let (sharded, shard_log) = train(
        dir.path(),
        "sharded",
        &format!(
            "{{source: shards, path: '{pattern}', testPath: '{}/test-{{000000..{:06}}}.tar', batchSize: 32}}",
            packed.display(),
            tests.len() - 1
        ),
    );
    let acc = |v: &serde_json::Value| v["test_accuracy"].as_f64().unwrap();
    assert!(acc(&builtin) > 0.9, "{builtin}");
    for (name, run) in [("images", &folder), ("shards", &sharded)] {
        assert!((acc(run) - acc(&builtin)).abs() < 0.04, "{name}: {run} vs the built-in {builtin}");
    }
    // The image folder's steps come from its readable files: the corrupt one is left out.
    assert_eq!(folder["steps"], 4 * ((train_n as u64 + 1) / 32));
    assert_eq!(sharded["steps"], 4 * (counted.total() / 32));
    // The broken files are named in warnings, never a crash.
    assert!(folder_log.contains("corrupt.png"), "{folder_log}");
    assert!(folder_log.contains("truncated.png"), "{folder_log}");
    assert!(shard_log.contains("truncated tar member"), "{shard_log}");
}

/// Images whose pixels spell their index, so a test can tell every sample apart.
fn numbered_folder(root: &Path, n: usize) {
    for i in 0..n {
        let class = root.join(format!("c{}", i % 3));
        std::fs::create_dir_all(&class).unwrap();
        let mut pixels = vec![0u8; 16];
        pixels[0] = (i % 256) as u8;
        pixels[1] = (i / 256) as u8;
        image::GrayImage::from_raw(4, 4, pixels).unwrap().save(class.join(format!("{i:04}.png"))).unwrap();
    }
}

fn ids(x: &[f32]) -> Vec<u32> {
    x.chunks(16).map(|s| (s[0] * 255.0).round() as u32 + 256 * (s[1] * 255.0).round() as u32).collect()
}

#[test]
fn every_rank_reads_its_own_samples_of_the_shards_once_per_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("numbered");
    numbered_folder(&root, 500);
    let packed = dir.path().join("shards");
    let summary = shards::pack(&root, &packed, 1500, 5).unwrap();
    assert!(summary.train_shards.len() > 3, "{summary:?}");
    let location =
        format!("{}/train-{{000000..{:06}}}.tar", packed.display(), summary.train_shards.len() - 1);
    let set = ShardSet::open(&location, None).unwrap();
    assert_eq!(set.total(), summary.train_samples);
    let (world, batch) = (3, 8);
    for epoch in 0..2 {
        let mut seen = BTreeSet::new();
        for rank in 0..world {
            let mut r = ShardReader::new(set.clone(), batch, 11, rank, world).unwrap();
            r.seek(data::DataCursor::at(epoch, 0)).unwrap();
            let (mut x, mut y) = (Vec::new(), Vec::new());
            for _ in 0..r.batches_per_epoch() {
                r.next_batch(&mut x, &mut y).unwrap();
                assert_eq!(y.len(), batch);
                for id in ids(&x) {
                    assert!(seen.insert(id), "sample {id} read twice in epoch {epoch}");
                }
            }
        }
        let per_rank = set.total() as usize / world;
        assert_eq!(seen.len(), world * (per_rank / batch) * batch);
    }
    // The image folder itself: each file once per epoch by exactly one rank.
    let folder = images::open(&root, None, Sizing::Own).unwrap();
    let mut seen = BTreeSet::new();
    for rank in 0..world {
        let mut r = data::ImageFolder::new(folder.train.clone(), batch, 3, rank, world).unwrap();
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for _ in 0..r.batches_per_epoch() {
            r.next_batch(&mut x, &mut y).unwrap();
            for id in ids(&x) {
                assert!(seen.insert(id), "file {id} read twice");
            }
        }
    }
    assert_eq!(seen.len(), world * (folder.train.files.len() / world / batch) * batch);
}

#[test]
fn images_of_different_sizes_need_an_image_size() {
    let dir = tempfile::tempdir().unwrap();
    for (name, w) in [("a", 4), ("b", 6)] {
        let class = dir.path().join(name);
        std::fs::create_dir_all(&class).unwrap();
        for i in 0..3 {
            image::RgbImage::new(w, 4).save(class.join(format!("{i}.png"))).unwrap();
        }
    }
    let err = images::open(dir.path(), None, Sizing::Own).unwrap_err().to_string();
    assert!(err.contains("images differ in size") && err.contains("data.imageSize"), "{err}");
    let f = images::open(dir.path(), None, Sizing::Fixed(5, 5)).unwrap();
    assert_eq!((f.train.shape.channels, f.train.shape.height, f.train.shape.width), (3, 5, 5));
    let test = images::decode_all(&f.test, &data::augment::Transform::plain(f.test.shape));
    assert_eq!(test.features.len(), test.len() * 75);
}
