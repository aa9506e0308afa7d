//! Data readers, the built-in split, synthetic data and sharded batching.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a panic is the failure report

use crate::trainer_support;

use std::io::Write;
use std::path::Path;

use tandem_api::{DataSource, DataSpec};
use tandem_input::InputShape;
use tandem_input::{self as data, CsvOptions, DataError, Loader, read_csv, read_idx, synthetic};

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn opts(classes: Option<usize>) -> CsvOptions {
    CsvOptions { label_column: None, classes, scale: 1.0, shape: None }
}

#[test]
fn csv_reads_features_and_label_from_any_column() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("d.csv");
    write(&p, b"a,b,c,label\n1,2,3,0\n4,5,6,2\n\n");
    let d = read_csv(&p, &opts(None)).unwrap();
    assert_eq!((d.len(), d.classes, d.shape.features()), (2, 3, 3));
    assert_eq!(d.features, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert_eq!(d.labels, [0, 2]);
    let first = CsvOptions { label_column: Some(0), ..opts(None) };
    let p2 = dir.path().join("first.csv.gz");
    write(&p2, &gz(b"1,0.5,0.25\n0,1,2\n"));
    let d = read_csv(&p2, &first).unwrap();
    assert_eq!(d.labels, [1, 0]);
    assert_eq!(d.features, [0.5, 0.25, 1.0, 2.0]);
}

fn format_error(err: DataError) -> (String, String) {
    let text = err.to_string();
    let DataError::Format { path, place, .. } = err else { panic!("expected a format error, got {text}") };
    let path = path.display().to_string();
    assert!(text.contains(&path) && text.contains(&place), "message {text:?} must name file and place");
    (path, place)
}

#[test]
fn bad_csv_files_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let wrong_cols = dir.path().join("cols.csv");
    write(&wrong_cols, b"1,2,0\n3,4,1\n5,1\n");
    let (file, line) = format_error(read_csv(&wrong_cols, &opts(Some(10))).unwrap_err());
    assert!(file.ends_with("cols.csv"));
    assert_eq!(line, "line 3");

    let out_of_range = dir.path().join("labels.csv");
    write(&out_of_range, b"1,2,0\n3,4,10\n");
    let err = read_csv(&out_of_range, &opts(Some(10))).unwrap_err();
    assert!(err.to_string().contains("out of range"), "{err}");
    assert_eq!(format_error(err).1, "line 2");

    let negative = dir.path().join("neg.csv");
    write(&negative, b"1,2,-1\n");
    assert_eq!(format_error(read_csv(&negative, &opts(None)).unwrap_err()).1, "line 1");

    let text = dir.path().join("text.csv");
    write(&text, b"1,2,0\n3,x,1\n");
    assert_eq!(format_error(read_csv(&text, &opts(None)).unwrap_err()).1, "line 2");

    // A gzip file cut short: the line where reading broke is named.
    let full = gz(&b"1,2,3,4,5,6,7,8,9,0\n".repeat(2000));
    let truncated = dir.path().join("cut.csv.gz");
    write(&truncated, &full[..full.len() / 2]);
    let err = read_csv(&truncated, &opts(Some(10))).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    let (_, line) = format_error(err);
    assert!(line.starts_with("line "), "{line}");

    let missing = read_csv(&dir.path().join("nope.csv"), &opts(None)).unwrap_err().to_string();
    assert!(missing.contains("make data"), "{missing}");
}

fn idx(magic: u32, dims: &[u32], body: &[u8]) -> Vec<u8> {
    let mut v = magic.to_be_bytes().to_vec();
    for d in dims {
        v.extend(d.to_be_bytes());
    }
    v.extend_from_slice(body);
    v
}

#[test]
fn idx_pairs_are_read_and_truncation_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let (imgs, labs) = (dir.path().join("x-images-idx3-ubyte"), dir.path().join("x-labels-idx1-ubyte.gz"));
    let pixels: Vec<u8> = (0..3 * 4 * 4).map(|i| (i * 5) as u8).collect();
    write(&imgs, &idx(2051, &[3, 4, 4], &pixels));
    write(&labs, &gz(&idx(2049, &[3], &[7, 0, 9])));
    let d = read_idx(&imgs, &labs, 10).unwrap();
    assert_eq!(d.shape, InputShape { channels: 1, height: 4, width: 4 });
    assert_eq!(d.labels, [7, 0, 9]);
    assert_eq!(d.sample(1)[0], 80.0 / 255.0);

    write(&imgs, &idx(2051, &[3, 4, 4], &pixels[..40]));
    let err = read_idx(&imgs, &labs, 10).unwrap_err();
    assert_eq!(format_error(err).1, "record 3");

    write(&imgs, &idx(2049, &[3, 4, 4], &pixels));
    assert!(read_idx(&imgs, &labs, 10).unwrap_err().to_string().contains("magic"));

    write(&imgs, &idx(2051, &[3, 4, 4], &pixels));
    write(&labs, &gz(&idx(2049, &[3], &[7, 12, 9])));
    let err = read_idx(&imgs, &labs, 10).unwrap_err();
    assert_eq!(format_error(err).1, "record 2");
}

#[test]
fn mnist5k_splits_4000_1000_the_same_way_every_time() {
    let dir = trainer_support::data_dir();
    let spec = DataSpec { source: DataSource::Mnist5k, ..DataSpec::default() };
    let a = data::load(&spec, &dir, 1).unwrap();
    let b = data::load(&spec, &dir, 2).unwrap();
    assert_eq!((a.train.len(), a.test.len()), (4000, 1000));
    assert_eq!(a.train.shape, InputShape { channels: 1, height: 28, width: 28 });
    assert_eq!(a.test.labels, b.test.labels, "the test set must not depend on the training seed");
    assert_eq!(a.test.features, b.test.features);
    assert!(a.train.features.iter().all(|&v| (0.0..=1.0).contains(&v)));
    // Every class is in both parts.
    for c in 0..10 {
        assert!(a.test.labels.contains(&c) && a.train.labels.contains(&c));
    }
    let digits =
        data::load(&DataSpec { source: DataSource::Digits, ..DataSpec::default() }, &dir, 1).unwrap();
    assert_eq!((digits.train.len(), digits.test.len()), (1437, 360));
    assert_eq!(digits.train.shape.features(), 64);
}

#[test]
fn synthetic_data_is_seeded() {
    let shape = InputShape { channels: 1, height: 4, width: 4 };
    assert_eq!(synthetic(50, shape, 3, 9), synthetic(50, shape, 3, 9));
    assert_ne!(synthetic(50, shape, 3, 9).features, synthetic(50, shape, 3, 10).features);
}

#[test]
fn shards_are_disjoint_equal_and_reshuffled_every_epoch() {
    let shape = InputShape { channels: 1, height: 2, width: 2 };
    let d = synthetic(103, shape, 4, 1);
    let world = 3;
    let loaders: Vec<Loader> = (0..world).map(|r| Loader::new(d.clone(), 5, 77, r, world).unwrap()).collect();
    for epoch in 0..2 {
        let mut all: Vec<u32> = loaders.iter().flat_map(|l| l.epoch_indices(epoch)).collect();
        assert_eq!(all.len(), 102, "each rank gets 34, the remainder waits");
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 102, "no sample is on two ranks");
    }
    assert_ne!(loaders[0].epoch_indices(0), loaders[0].epoch_indices(1));
    let again = Loader::new(d.clone(), 5, 77, 0, world).unwrap();
    assert_eq!(again.epoch_indices(1), loaders[0].epoch_indices(1));

    // The batch stream wraps into the next epoch and can be resumed from a cursor.
    let mut l = Loader::new(d.clone(), 5, 77, 1, world).unwrap();
    assert_eq!(l.batches_per_epoch(), 6);
    let (mut x, mut y) = (vec![], vec![]);
    let mut seen = vec![];
    for _ in 0..9 {
        let at = l.next_batch(&mut x, &mut y);
        seen.push((at, y.clone(), x.clone()));
    }
    assert_eq!(seen[6].0.epoch, 1);
    let mut r = Loader::new(d.clone(), 5, 77, 1, world).unwrap();
    r.seek(seen[4].0).unwrap();
    for s in &seen[4..] {
        let at = r.next_batch(&mut x, &mut y);
        assert_eq!((at, &y, &x), (s.0, &s.1, &s.2));
    }
    let err = Loader::new(d, 64, 1, 0, 2).unwrap_err().to_string();
    assert!(err.contains("batchSize"), "{err}");
}

#[test]
fn the_job_plan_counts_the_steps_the_loader_serves() {
    // The plan is what the parameter servers' schedule spans; the loader is what the workers run.
    let train = synthetic(1000, InputShape { channels: 1, height: 2, width: 2 }, 3, 1);
    for (groups, size, batch, epochs) in [(1, 1, 32, 3), (2, 2, 16, 2), (3, 1, 50, 1), (1, 4, 7, 5)] {
        let spec = trainer_support::spec(&format!(
            "apiVersion: tandem.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: t}}\nspec:\n  data: {{batchSize: {batch}}}\n  \
             training: {{algorithm: hybrid, epochs: {epochs}}}\n  parameterServers: {{replicas: 1}}\n  \
             workers: {{groups: {groups}, groupSize: {size}, maxGroups: 4}}\n"
        ));
        let plan = tandem_api::JobPlan::resolve(&spec, train.len() as u64).unwrap();
        let world = (groups * size) as usize;
        for rank in 0..world {
            let loader = Loader::new(train.clone(), batch, 7, rank, world).unwrap();
            assert_eq!(plan.steps_per_epoch, loader.batches_per_epoch(), "{groups}x{size}, batch {batch}");
        }
        assert_eq!(plan.total_steps, epochs * plan.steps_per_epoch);
    }
}
