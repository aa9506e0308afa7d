//! `gemm-peak [--threads 1,2] [--seconds S] [--json FILE] [--no-references]`: this machine's GEMM
//! speed at the training step's shapes, the engine's GEMM beside the `gemm` crate, `matrixmultiply`
//! and Debian's OpenBLAS, with the CPU's theoretical and FMA-loop peaks.

use std::collections::BTreeMap;

use tandem_kernels::peak::{self, PeakOptions};

fn main() {
    let mut opts = PeakOptions::default();
    let mut json_out: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--threads" => {
                let v = args.next().unwrap_or_default();
                let parsed: Result<Vec<usize>, _> = v.split(',').map(str::parse).collect();
                match parsed {
                    Ok(t) if !t.is_empty() && t.iter().all(|&n| n >= 1) => opts.threads = t,
                    _ => fail(&format!("--threads wants a comma-separated list of counts ≥ 1, got {v:?}")),
                }
            }
            "--seconds" => {
                let v = args.next().unwrap_or_default();
                match v.parse::<f64>() {
                    Ok(s) if s > 0.0 => opts.seconds = s,
                    _ => fail(&format!("--seconds wants a positive number, got {v:?}")),
                }
            }
            "--json" => json_out = args.next(),
            "--no-references" => opts.references = false,
            other => fail(&format!(
                "unknown argument {other:?}; usage: gemm-peak [--threads 1,2] [--seconds S] [--json FILE] [--no-references]"
            )),
        }
    }
    let cpu = peak::theoretical();
    let fma = peak::fma_peak(0.3);
    println!(
        "cpu: {} · {} MHz reported · {} f32 lanes · fma {} · theoretical {:.1} GFLOP/s per core (2 FMA units) · FMA loop {:.1} GFLOP/s per core",
        cpu.model, cpu.mhz, cpu.lanes, cpu.fma, cpu.gflops_per_core, fma
    );
    if opts.references && !peak::openblas_available() {
        println!("openblas: not installed (apt-get install libopenblas0), not measured");
    }
    let records = peak::measure(&opts);
    let libs = ["tandem", "gemm-crate", "matrixmultiply", "openblas"];
    println!(
        "\n{:24} {:>7} {:>8} {:>10} {:>12} {:>15} {:>10}  GFLOP/s",
        "shape", "m·n·k", "threads", libs[0], libs[1], libs[2], libs[3]
    );
    let mut rows: BTreeMap<(usize, usize), Vec<&peak::GemmRecord>> = BTreeMap::new();
    for (i, r) in records.iter().enumerate() {
        let shape_idx = opts.shapes.iter().position(|s| s == &r.shape).unwrap_or(i);
        rows.entry((shape_idx, r.threads)).or_default().push(r);
    }
    for ((si, threads), recs) in &rows {
        let s = &opts.shapes[*si];
        let cell = |lib: &str| {
            recs.iter().find(|r| r.library == lib).map_or("-".to_owned(), |r| format!("{:.1}", r.gflops))
        };
        println!(
            "{:24} {:>7} {:>8} {:>10} {:>12} {:>15} {:>10}",
            s.name,
            format!("{:.1}M", s.flops() / 2e6),
            threads,
            cell(libs[0]),
            cell(libs[1]),
            cell(libs[2]),
            cell(libs[3])
        );
    }
    let report = serde_json::json!({ "bench": "gemm-peak", "cpu": cpu, "fma_loop_gflops_per_core": fma, "records": records });
    if let Some(path) = json_out
        && let Err(e) = std::fs::write(&path, format!("{report}\n"))
    {
        fail(&format!("writing {path}: {e}"));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("gemm-peak: {msg}");
    std::process::exit(2);
}
