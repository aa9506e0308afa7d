//! The models against PyTorch: tiny versions of ResNet-8 (CIFAR stem), ResNet-50 (bottlenecks,
//! ImageNet stem), VGG-A and the GPT, written independently in plain PyTorch
//! (`bench/torch_models.py`, the modules the benchmark times; `fixtures/make_fixtures.py` made the
//! fixtures once from them, in float64). Same tensor names,
//! shapes and flat order; with the fixture's parameters, batch-norm state and batch, one training
//! step must give PyTorch's loss, every gradient value, the updated running statistics, and the
//! evaluation-mode logits under those statistics — at 1 and 2 threads — and every tensor gets a
//! non-zero gradient.

use crate::common::assert_close;
use serde_json::Value;
use tandem_kernels::models::{self, GptConfig, ResNetConfig, ResNetFamily, VggConfig, VggVariant};
use tandem_kernels::net::{Batch, Network};

fn load(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}.json", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn ints(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn usize_of(v: &Value, key: &str) -> usize {
    v[key].as_u64().unwrap() as usize
}

fn input_shape(cfg: &Value) -> (usize, usize, usize) {
    let s: Vec<usize> =
        cfg["input"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    (s[0], s[1], s[2])
}

fn build(f: &Value, threads: usize) -> Network {
    let cfg = &f["config"];
    match f["model"].as_str().unwrap() {
        "resnet8_cifar" | "resnet50_imagenet" => {
            let family = if cfg["family"] == "Cifar" { ResNetFamily::Cifar } else { ResNetFamily::ImageNet };
            let rc = ResNetConfig { depth: usize_of(cfg, "depth"), family, width: usize_of(cfg, "width") };
            models::resnet(rc, input_shape(cfg), usize_of(cfg, "classes"), threads).unwrap()
        }
        "vgg_a" => {
            let vc = VggConfig {
                variant: VggVariant::A,
                width: usize_of(cfg, "width"),
                hidden: usize_of(cfg, "hidden"),
            };
            models::vgg(vc, input_shape(cfg), usize_of(cfg, "classes"), threads).unwrap()
        }
        "gpt" => {
            let gc = GptConfig {
                vocab: usize_of(cfg, "vocab"),
                context: usize_of(cfg, "context"),
                layers: usize_of(cfg, "layers"),
                heads: usize_of(cfg, "heads"),
                width: usize_of(cfg, "width"),
            };
            models::gpt(gc, threads).unwrap()
        }
        other => panic!("unknown fixture model {other}"),
    }
}

fn names(v: &Value) -> Vec<(String, Vec<usize>)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let shape = e[1].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            (e[0].as_str().unwrap().to_owned(), shape)
        })
        .collect()
}

fn check(name: &str) {
    let f = load(name);
    let params = floats(&f["param_values"]);
    let state0 = floats(&f["state_values"]);
    let targets = ints(&f["targets"]);
    let tokens = f["model"] == "gpt";
    let (xf, xt) = if tokens { (Vec::new(), ints(&f["input"])) } else { (floats(&f["input"]), Vec::new()) };
    let batch = || if tokens { Batch::Tokens(&xt) } else { Batch::Values(&xf) };
    for threads in [1, 2] {
        let mut net = build(&f, threads);
        let ours: Vec<(String, Vec<usize>)> =
            net.params().iter().map(|e| (e.name.clone(), e.shape.clone())).collect();
        assert_eq!(ours, names(&f["params"]), "{name}: parameter names, shapes and order");
        let ours: Vec<(String, Vec<usize>)> =
            net.state().iter().map(|e| (e.name.clone(), e.shape.clone())).collect();
        assert_eq!(ours, names(&f["state"]), "{name}: state names, shapes and order");
        let mut state = state0.clone();
        let mut grads = vec![0.0; params.len()];
        let stats = net.forward_backward(&params, &mut state, &mut grads, batch(), &targets).unwrap();
        let want = f["loss"].as_f64().unwrap();
        let what = format!("{name} at {threads} thread(s)");
        assert!(
            (stats.loss as f64 - want).abs() < 1e-5 * want.abs().max(1.0),
            "{what}: loss {} vs PyTorch's {want}",
            stats.loss
        );
        assert_close(&grads, &floats(&f["grads"]), 2e-4, &format!("{what}: gradient"));
        // Per tensor too, so that a small tensor's error is not hidden by a large one's scale.
        let want_g = floats(&f["grads"]);
        let scale = want_g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let mut silent = Vec::new();
        for e in net.params() {
            // Every tensor is reached: a tensor left out of the backward pass would match a zero
            // reference. A reference at rounding noise of the whole gradient (ResNet-50's stem
            // bias, whose shift the normalizations after it cancel: PyTorch gives 3.6e-15 in
            // float64 where the gradient reaches 35) carries no signal either way: it must only
            // stay as small in ours, which the comparison below checks.
            let negligible = |g: &[f32]| g.iter().all(|v| v.abs() <= 1e-9 * scale);
            if negligible(&want_g[e.range()]) {
                silent.push(e.name.clone());
            } else {
                assert!(
                    !negligible(&grads[e.range()]),
                    "{what}: {} received no gradient (PyTorch's is {:?}…)",
                    e.name,
                    &want_g[e.range()][..e.range().len().min(4)]
                );
            }
            assert_close(
                &grads[e.range()],
                &want_g[e.range()],
                1e-3,
                &format!("{what}: gradient of {}", e.name),
            );
        }
        // The exception stays one: a fixture whose references are silent cannot tell a missed tensor.
        assert!(silent.len() <= 1, "{what}: PyTorch's gradients of {silent:?} are rounding noise");
        // 1e-4: a variance over few values (ResNet-50's 1×1 maps, batch 2) cancels, and our inputs
        // to it are float32 convolutions where PyTorch's are float64.
        assert_close(
            &state,
            &floats(&f["state_after"]),
            1e-4,
            &format!("{what}: running statistics after the step"),
        );
        let mut logits = Vec::new();
        net.logits(&params, &state, batch(), &mut logits).unwrap();
        assert_close(&logits, &floats(&f["eval_logits"]), 1e-4, &format!("{what}: evaluation logits"));
    }
}

#[test]
fn resnet8_cifar_matches_pytorch() {
    check("resnet8_cifar");
}

#[test]
fn resnet50_bottlenecks_match_pytorch() {
    check("resnet50_imagenet");
}

#[test]
fn vgg_a_matches_pytorch() {
    check("vgg_a");
}

#[test]
fn gpt_matches_pytorch() {
    check("gpt");
}
