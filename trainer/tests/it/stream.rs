//! The streamed data source: CSV shard files read as training goes, each epoch served once over
//! the ranks, and a cursor that resumes the stream exactly — also through a training run's
//! checkpoint.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tandem_compute::device::Device;
use tandem_compute::model;
use tandem_compute::optim::Optimizer;
use tandem_compute::train::{LocalStep, Trainer};
use tandem_input::{CsvOptions, DataCursor, InputShape, ShardStream, Source, read_csv, split};

use crate::trainer_support;

/// The 8×8 digits as `shards` CSV files in `dir`, with `id` each row's 65th feature its row
/// number, so that a sample names itself; returns the paths and the row count.
fn digit_shards(dir: &Path, shards: usize, id: bool) -> (Vec<PathBuf>, usize) {
    let opts = CsvOptions { label_column: None, classes: Some(10), scale: 16.0, shape: None };
    let digits = read_csv(&trainer_support::data_dir().join(tandem_input::DIGITS_FILE), &opts).unwrap();
    let mut texts = vec![String::new(); shards];
    for i in 0..digits.len() {
        let row: Vec<String> = digits.sample(i).iter().map(|v| v.to_string()).collect();
        let id = if id { format!("{i},") } else { String::new() };
        texts[i % shards] += &format!("{},{id}{}\n", row.join(","), digits.labels[i]);
    }
    let paths = (0..shards)
        .map(|s| {
            let p = dir.join(format!("part-{s}.csv"));
            std::fs::write(&p, &texts[s]).unwrap();
            p
        })
        .collect();
    (paths, digits.len())
}

fn stream_opts(features: usize) -> CsvOptions {
    CsvOptions {
        label_column: None,
        classes: Some(10),
        scale: 1.0,
        shape: Some(InputShape { channels: 1, height: 1, width: features }),
    }
}

/// The row numbers of one batch.
fn ids(x: &[f32]) -> Vec<u32> {
    x.chunks(65).map(|s| s[64] as u32).collect()
}

#[test]
fn every_epoch_serves_each_row_once_over_the_ranks_in_a_new_shard_order() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, rows) = digit_shards(dir.path(), 5, true);
    let (world, batch) = (2, 16);
    let mut ranks: Vec<ShardStream> = (0..world)
        .map(|r| ShardStream::open(paths.clone(), stream_opts(65), batch, 7, r, world).unwrap())
        .collect();
    let per_epoch = ranks[0].batches_per_epoch();
    assert_eq!(ranks[0].samples(), rows as u64);
    assert_eq!(per_epoch, (rows as u64 / world as u64) / batch as u64);
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let mut orders = Vec::new();
    for epoch in 0..2u64 {
        let mut seen = BTreeSet::new();
        let mut order = Vec::new();
        for b in 0..per_epoch {
            for (r, s) in ranks.iter_mut().enumerate() {
                let at = s.next_batch(&mut x, &mut y).unwrap();
                assert_eq!(at, DataCursor::at(epoch, b), "rank {r}");
                assert_eq!((x.len(), y.len()), (batch * 65, batch));
                for id in ids(&x) {
                    assert!(seen.insert(id), "epoch {epoch}: row {id} served twice");
                    order.push(id);
                }
            }
        }
        assert_eq!(seen.len() as u64, per_epoch * (world * batch) as u64);
        orders.push(order);
    }
    assert_ne!(orders[0], orders[1], "the shard order changes with the epoch");
    assert_ne!(ranks[0].shard_order(0), ranks[0].shard_order(1));
}

#[test]
fn seeking_a_cursor_continues_the_stream_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = digit_shards(dir.path(), 3, true);
    let mut straight = ShardStream::open(paths.clone(), stream_opts(65), 32, 3, 1, 2).unwrap();
    let per_epoch = straight.batches_per_epoch();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    let mut served = Vec::new();
    for _ in 0..per_epoch + 10 {
        let at = straight.next_batch(&mut x, &mut y).unwrap();
        served.push((at, ids(&x), y.clone()));
    }
    for k in [0, 5, per_epoch - 1, per_epoch + 4] {
        let mut resumed = ShardStream::open(paths.clone(), stream_opts(65), 32, 3, 1, 2).unwrap();
        resumed.seek(served[k as usize].0).unwrap();
        for (at, want, labels) in &served[k as usize..] {
            assert_eq!(resumed.next_batch(&mut x, &mut y).unwrap(), *at);
            assert_eq!((&ids(&x), &y), (want, labels), "resumed at batch {k}, batch {at:?}");
        }
    }
    let err = straight.seek(DataCursor::at(0, per_epoch)).unwrap_err().to_string();
    assert!(err.contains("past the"), "{err}");

    // Given another share from an epoch on (the job's epoch plan changed the groups), the stream
    // serves what a stream opened on that share serves.
    straight.set_share(0, 3, DataCursor::at(2, 0)).unwrap();
    let mut fresh = ShardStream::open(paths.clone(), stream_opts(65), 32, 3, 0, 3).unwrap();
    fresh.seek(DataCursor::at(2, 0)).unwrap();
    assert_eq!(straight.batches_per_epoch(), fresh.batches_per_epoch());
    for _ in 0..fresh.batches_per_epoch() + 2 {
        let (mut fx, mut fy) = (Vec::new(), Vec::new());
        assert_eq!(straight.next_batch(&mut x, &mut y).unwrap(), fresh.next_batch(&mut fx, &mut fy).unwrap());
        assert_eq!((ids(&x), &y), (ids(&fx), &fy));
    }
}

#[test]
fn a_training_run_on_a_stream_resumes_from_its_checkpoint_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let (paths, _) = digit_shards(dir.path(), 4, false);
    let spec = trainer_support::small_job(
        "{kind: mlp, hidden: [16]}",
        "{source: digits, batchSize: 32}",
        "{kind: sgd, learningRate: 0.1, momentum: 0.9}",
        60,
    );
    let opts = stream_opts(64);
    let test = {
        let all = read_csv(&paths[0], &opts).unwrap();
        split(&all, 100).unwrap().test
    };
    let trainer = || {
        let stream = ShardStream::open(paths.clone(), opts.clone(), 32, spec.training.seed, 0, 1).unwrap();
        let net = model::build(&spec.model, stream.shape(), 10, spec.training.seed, &Device::Cpu).unwrap();
        let plan = crate::trainer_support::plan(&spec, stream.samples(), 1);
        let t = Trainer::with_parts(&spec, &plan, net, Box::new(stream), test.clone()).unwrap();
        let u = LocalStep::new(Optimizer::new(&spec.training.optimizer, t.params().len()));
        (t, u)
    };
    let (mut straight, mut su) = trainer();
    for _ in 0..60 {
        straight.step(&mut su).unwrap();
    }
    let path = dir.path().join("k.safetensors");
    let (mut first, mut fu) = trainer();
    // Past the first epoch (1,797 rows / 32 = 56 batches), so the cursor's epoch matters.
    for _ in 0..57 {
        first.step(&mut fu).unwrap();
    }
    first.save(&fu, &path).unwrap();
    let (mut resumed, mut ru) = trainer();
    resumed.resume(&mut ru, &path).unwrap();
    assert_eq!(resumed.cursor(), DataCursor::at(1, 1));
    while resumed.step_count() < 60 {
        resumed.step(&mut ru).unwrap();
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(resumed.params()), bits(straight.params()));
    assert!(straight.evaluate().unwrap().accuracy > 0.5, "a model trained on the stream learns");
}
