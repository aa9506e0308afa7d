//! Training-step throughput of Tandem's compute (candle on CPU), one model at a time, batch 64, on
//! seeded synthetic MNIST-shaped data. Prints one JSON object per model with samples/s and where a
//! step's time goes. `bench/train.sh` runs it side by side with the same models in PyTorch.
//!
//! Run: `cargo bench -p tandem-trainer --bench train -- [steps]` (threads: RAYON_NUM_THREADS).

use std::time::Instant;

use tandem::compute::data::InputShape;
use tandem::compute::data::{Loader, synthetic};
use tandem::compute::device::Device;
use tandem::compute::model::Net;
use tandem::compute::optim::Optimizer;
use tandem_api::{ModelKind, ModelSpec, OptimizerSpec};

fn main() -> anyhow::Result<()> {
    let steps: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(200);
    let batch = 64;
    let shape = InputShape { channels: 1, height: 28, width: 28 };
    let data = synthetic(batch * 50, shape, 10, 1);
    let models = [
        ("mlp", ModelSpec { kind: ModelKind::Mlp, hidden: vec![256, 128], channels: vec![16, 32] }),
        ("cnn", ModelSpec { kind: ModelKind::Cnn, hidden: vec![128], channels: vec![16, 32] }),
    ];
    let opt_spec = OptimizerSpec { learning_rate: 0.01, momentum: 0.9, ..OptimizerSpec::default() };
    for (name, spec) in models {
        let model = Net::new(&spec, shape, 10, 1, &Device::Cpu)?;
        let mut loader = Loader::new(data.clone(), batch, 1, 0, 1)?;
        let mut opt = Optimizer::new(&opt_spec, model.num_params());
        let mut params = vec![0.0; model.num_params()];
        let mut grads = vec![0.0; model.num_params()];
        model.read_params(&mut params)?;
        let (mut x, mut y) = (Vec::new(), Vec::new());
        // Phases: batch assembly, forward+backward+gradient copy, optimizer, weight write-back.
        let mut t = [0.0f64; 4];
        let warmup = steps / 10 + 5;
        let mut total = 0.0;
        for i in 0..warmup + steps {
            let t0 = Instant::now();
            loader.next_batch(&mut x, &mut y);
            let t1 = Instant::now();
            model.loss_and_grad(&x, &y, &mut grads)?;
            let t2 = Instant::now();
            opt.step(&mut params, &grads, 0.01)?;
            let t3 = Instant::now();
            model.write_params(&params)?;
            let t4 = Instant::now();
            if i >= warmup {
                for (acc, d) in t.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2, t4 - t3]) {
                    *acc += d.as_secs_f64();
                }
                total += (t4 - t0).as_secs_f64();
            }
        }
        // Forward alone, to split the compute phase.
        let (xt, _) = model.batch_tensors(&x, &y)?;
        let t0 = Instant::now();
        for _ in 0..steps {
            model.forward(&xt)?;
        }
        let forward = t0.elapsed().as_secs_f64() / steps as f64;
        let per = |v: f64| v / steps as f64 * 1e3;
        let record = serde_json::json!({
            "impl": "tandem",
            "model": name,
            "batch": batch,
            "steps": steps,
            "threads": candle_core::utils::get_num_threads(),
            "parameters": model.num_params(),
            "samples_per_second": (steps * batch) as f64 / total,
            "ms_per_step": per(total),
            "breakdown_ms": {
                "batch": per(t[0]),
                "forward": forward * 1e3,
                "backward_and_grad_copy": per(t[1]) - forward * 1e3,
                "optimizer": per(t[2]),
                "write_params": per(t[3]),
            },
        });
        println!("{record}");
    }
    Ok(())
}
