//! Training-step throughput of the trainer's own step, through the `tandem_compute::model::Model`
//! trait exactly as `tandem train` runs it (batch assembly, forward + backward into the flat gradient,
//! the optimizer over the flat parameters), on seeded synthetic MNIST-shaped data, batch 64, for
//! both CPU backends: `tandem-trainer` (what `model::build` picks on the CPU: the compute engine,
//! on `TANDEM_THREADS` threads) and `tandem-candle` (the candle backend, on `RAYON_NUM_THREADS`).
//! Prints one JSON object per model and backend with samples/s and where a step's time goes.
//! `bench/train.sh` runs it side by side with the engine's own step and PyTorch.
//!
//! Run: `cargo bench -p tandem-trainer --bench train -- [steps]`.

use std::time::Instant;

use tandem_api::{ModelKind, ModelSpec, OptimizerSpec};
use tandem_compute::device::Device;
use tandem_compute::model::{self, Batch, Model, Net, engine};
use tandem_compute::optim::Optimizer;
use tandem_input::InputShape;
use tandem_input::{Loader, synthetic};

fn main() -> anyhow::Result<()> {
    let steps: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(200);
    let batch = 64;
    let shape = InputShape { channels: 1, height: 28, width: 28 };
    let data = synthetic(batch * 50, shape, 10, 1);
    let models = [
        (
            "mlp",
            ModelSpec {
                kind: ModelKind::Mlp,
                hidden: vec![256, 128],
                channels: vec![16, 32],
                ..ModelSpec::default()
            },
        ),
        (
            "cnn",
            ModelSpec {
                kind: ModelKind::Cnn,
                hidden: vec![128],
                channels: vec![16, 32],
                ..ModelSpec::default()
            },
        ),
    ];
    let opt_spec = OptimizerSpec { learning_rate: 0.01, momentum: 0.9, ..OptimizerSpec::default() };
    for (name, spec) in models {
        let backends: [(&str, Box<dyn Model>, usize); 2] = [
            ("tandem-trainer", model::build(&spec, shape, 10, 1, &Device::Cpu)?, engine::threads()?),
            (
                "tandem-candle",
                Box::new(Net::new(&spec, shape, 10, 1, &Device::Cpu)?),
                candle_core::utils::get_num_threads(),
            ),
        ];
        for (backend, mut model, threads) in backends {
            let mut loader = Loader::new(data.clone(), batch, 1, 0, 1)?;
            let n = model.layout().len();
            let mut opt = Optimizer::new(&opt_spec, n);
            let (mut params, mut grads) = (vec![0.0; n], vec![0.0; n]);
            let mut state = vec![0.0; model.state_layout().len()];
            model.init(&mut params, &mut state)?;
            let (mut x, mut y) = (Vec::new(), Vec::new());
            // Phases: batch assembly, forward + backward into the flat gradient, optimizer.
            let mut t = [0.0f64; 3];
            let warmup = steps / 10 + 5;
            for i in 0..warmup + steps {
                let t0 = Instant::now();
                loader.next_batch(&mut x, &mut y);
                let t1 = Instant::now();
                let b = Batch { features: &x, labels: &y };
                model.forward_backward(&params, &mut state, &mut grads, b)?;
                let t2 = Instant::now();
                opt.step(&mut params, &grads, 0.01)?;
                let t3 = Instant::now();
                if i >= warmup {
                    for (acc, d) in t.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2]) {
                        *acc += d.as_secs_f64();
                    }
                }
            }
            let total: f64 = t.iter().sum();
            let per = |v: f64| v / steps as f64 * 1e3;
            let record = serde_json::json!({
                "impl": backend,
                "model": name,
                "batch": batch,
                "steps": steps,
                "threads": threads,
                "parameters": n,
                "samples_per_second": (steps * batch) as f64 / total,
                "ms_per_step": per(total),
                "breakdown_ms": {
                    "batch": per(t[0]),
                    "forward_backward": per(t[1]),
                    "optimizer": per(t[2]),
                },
            });
            println!("{record}");
        }
    }
    Ok(())
}
