//! `tandem data`: turn an image folder into tar shards (`pack`), count and check a data set
//! (`inspect`, local or `s3://`), time the image pipeline on it (`bench`), and copy a folder to
//! object storage (`upload`).

use std::path::PathBuf;

use anyhow::Context;
use tandem_api::{DataSource, DataSpec};
use tandem_input::images::{self, Sizing};
use tandem_input::shards::{self, ShardSet};
use tandem_input::{self as data, store};

/// The `tandem data` subcommands.
#[derive(clap::Subcommand)]
pub enum Data {
    /// Write an image folder (<root>/<class>/<file>.png|jpg, or <root>/train and <root>/test) as
    /// WebDataset tar shards: train-000000.tar, … and test-000000.tar, …
    Pack(PackArgs),
    /// Count the samples and classes of an image folder or tar shards and decode a few images.
    Inspect(InspectArgs),
    /// Time the training pipeline (decoding, augmentation, batching) on an image folder or tar
    /// shards: prints one JSON line with images/s and the process's peak memory.
    Bench(BenchArgs),
    /// Copy a folder (packed shards, an image folder) or a file to s3://<bucket>/<prefix>, keeping
    /// relative names. The store and credentials come from the AWS environment: AWS_ENDPOINT_URL
    /// for an S3-compatible store, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_REGION.
    Upload(UploadArgs),
    /// Write a built-in data set (digits, mnist5k or fashion-mnist) as an image folder of PNG
    /// files, <output>/train/<class>/<n>.png and <output>/test/<class>/<n>.png, to pack into
    /// shards or train on as `source: images`.
    Export(ExportArgs),
}

/// `tandem data bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// An image folder or tar shards, as `data.path` names them.
    pub path: String,
    /// Decoding threads (`data.loader.threads`).
    #[arg(long, default_value_t = 1)]
    pub threads: u32,
    /// Ready batches queued (`data.loader.prefetchBatches`).
    #[arg(long, default_value_t = 2)]
    pub prefetch: u32,
    /// Samples per batch.
    #[arg(long, default_value_t = 64)]
    pub batch: u32,
    /// Seconds timed, after the first batch.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// Sample size `HEIGHT,WIDTH` (`data.imageSize`).
    #[arg(long)]
    pub image_size: Option<String>,
    /// `data.augment` as JSON, e.g. '{"randomResizedCrop": {}, "horizontalFlip": true}'.
    #[arg(long)]
    pub augment: Option<String>,
    /// `data.normalize` as JSON, e.g. '{"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}'.
    #[arg(long)]
    pub normalize: Option<String>,
}

/// `tandem data export`.
#[derive(clap::Args)]
pub struct ExportArgs {
    /// The built-in data set.
    #[arg(value_parser = ["digits", "mnist5k", "fashion-mnist"])]
    pub name: String,
    /// Folder the images are written to (created if missing).
    pub output: PathBuf,
    /// Folder holding the built-in data sets (`make data` fills it).
    #[arg(long, env = "TANDEM_DATA_DIR", default_value = "data")]
    pub data_dir: PathBuf,
}

/// `tandem data upload`.
#[derive(clap::Args)]
pub struct UploadArgs {
    /// The local folder or file.
    pub source: PathBuf,
    /// Where it goes: s3://<bucket>/<prefix>.
    pub destination: String,
}

/// `tandem data pack`.
#[derive(clap::Args)]
pub struct PackArgs {
    /// The image folder.
    pub source: PathBuf,
    /// Folder the shards are written to (created if missing).
    pub output: PathBuf,
    /// Bytes of images per shard: a number with an optional K, M or G suffix.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    pub shard_size: u64,
    /// Seed of the order in which samples are written.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// `tandem data inspect`.
#[derive(clap::Args)]
pub struct InspectArgs {
    /// An image folder, a folder of .tar shards, a shard or a pattern such as train-{000..009}.tar;
    /// local, or in object storage as s3://<bucket>/<prefix> (reached as `upload` says).
    pub path: String,
    /// Images to decode and show.
    #[arg(long, default_value_t = 3)]
    pub show: usize,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (digits, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                _ => return Err(format!("{s:?}: the size suffix is K, M or G")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: u64 = digits.parse().map_err(|_| format!("{s:?} is not a size such as 64M"))?;
    if n == 0 {
        return Err("a shard size must be above 0".into());
    }
    Ok(n * mult)
}

/// Runs `tandem data`.
pub fn run(cmd: Data) -> anyhow::Result<()> {
    super::init_logging();
    match cmd {
        Data::Pack(a) => pack(a),
        Data::Inspect(a) => inspect(a),
        Data::Bench(a) => bench(a),
        Data::Upload(a) => upload(a),
        Data::Export(a) => export(a),
    }
}

/// `VmHWM` (peak) and `VmRSS` of this process, in MiB.
fn memory_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kib| kib.parse::<f64>().ok())
            .map_or(0.0, |kib| kib / 1024.0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

fn bench(a: BenchArgs) -> anyhow::Result<()> {
    use tandem_api::{DataSource, DataSpec, LoaderSpec};
    use tandem_input::{ImageFolder, Prep, ShardReader, Source};
    let image_size = match a.image_size.as_deref() {
        Some(s) => {
            let v: Vec<u32> = s
                .split(',')
                .map(|p| p.trim().parse())
                .collect::<Result<_, _>>()
                .with_context(|| format!("--image-size {s:?}: give HEIGHT,WIDTH, such as 96,96"))?;
            anyhow::ensure!(v.len() == 2, "--image-size {s:?}: give HEIGHT,WIDTH, such as 96,96");
            Some(v)
        }
        None => None,
    };
    let json = |what: &str, s: &Option<String>| -> anyhow::Result<Option<serde_json::Value>> {
        s.as_deref().map(serde_json::from_str).transpose().with_context(|| format!("--{what} is not JSON"))
    };
    let spec = DataSpec {
        source: DataSource::Images,
        path: Some(a.path.clone()),
        image_size: image_size.clone(),
        augment: json("augment", &a.augment)?.map(serde_json::from_value).transpose().context("--augment")?,
        normalize: json("normalize", &a.normalize)?
            .map(serde_json::from_value)
            .transpose()
            .context("--normalize")?,
        batch_size: a.batch,
        loader: Some(LoaderSpec { threads: Some(a.threads), prefetch_batches: Some(a.prefetch) }),
        ..DataSpec::default()
    };
    let size = image_size.as_deref().map(|v| (v[0], v[1]));
    let path = std::path::Path::new(&a.path);
    let (before_mib, _) = memory_mib();
    let mut source: Box<dyn Source> = if path.is_dir() && shards::shard_paths(&a.path).is_err() {
        let f = images::open(path, None, Sizing::of(size)).with_context(|| format!("opening {}", a.path))?;
        let prep = Prep::of(&spec, f.train.shape, 0)?;
        Box::new(ImageFolder::new(f.train, a.batch as usize, 0, 0, 1)?.with_prep(prep))
    } else {
        let set = ShardSet::open(&a.path, size).with_context(|| format!("opening {}", a.path))?;
        let prep = Prep::of(&spec, set.shape, 0)?;
        Box::new(ShardReader::new(set, a.batch as usize, 0, 0, 1)?.with_prep(prep))
    };
    let (mut x, mut y) = (Vec::new(), Vec::new());
    source.next_batch(&mut x, &mut y)?;
    let (_, index_mib) = memory_mib();
    let started = std::time::Instant::now();
    let waited_before = source.waited();
    let mut images = 0u64;
    while started.elapsed().as_secs_f64() < a.seconds {
        source.next_batch(&mut x, &mut y)?;
        images += y.len() as u64;
    }
    let seconds = started.elapsed().as_secs_f64();
    let (peak_mib, rss_mib) = memory_mib();
    let shape = source.shape();
    let record = serde_json::json!({
        "bench": "data",
        "impl": "tandem",
        "threads": a.threads,
        "batch": a.batch,
        "images": images,
        "seconds": seconds,
        "images_per_second": images as f64 / seconds,
        "waited_seconds": source.waited().saturating_sub(waited_before).as_secs_f64(),
        "samples_in_set": source.samples(),
        "decoded_set_mib": source.samples() as f64 * shape.features() as f64 * 4.0 / (1 << 20) as f64,
        "batch_mib": a.batch as f64 * shape.features() as f64 * 4.0 / (1 << 20) as f64,
        "rss_mib_before_open": before_mib,
        "rss_mib_after_first_batch": index_mib,
        "rss_mib_at_end": rss_mib,
        "peak_rss_mib": peak_mib,
        "skipped": source.skipped(),
    });
    println!("{record}");
    Ok(())
}

fn pack(a: PackArgs) -> anyhow::Result<()> {
    let s = shards::pack(&a.source, &a.output, a.shard_size, a.seed)
        .with_context(|| format!("packing {} into {}", a.source.display(), a.output.display()))?;
    println!(
        "packed {} training samples into {} shard(s) and {} test samples into {} shard(s) in {}; {} classes; {} file(s) skipped",
        s.train_samples,
        s.train_shards.len(),
        s.test_samples,
        s.test_shards.len(),
        a.output.display(),
        s.classes.len(),
        s.skipped
    );
    Ok(())
}

fn inspect(a: InspectArgs) -> anyhow::Result<()> {
    let path = std::path::Path::new(&a.path);
    let is_folder = store::is_dir(path).with_context(|| format!("inspecting {}", a.path))?;
    let is_folder_of_images = is_folder && shards::shard_paths(&a.path).is_err();
    if is_folder_of_images {
        let f = images::open(path, None, Sizing::First).with_context(|| format!("inspecting {}", a.path))?;
        println!("image folder {}", a.path);
        println!("classes: {} ({})", f.train.classes.len(), f.train.classes.join(", "));
        println!("training samples: {}", f.train.files.len());
        println!("test samples: {}", f.test.files.len());
        println!("skipped: {}", f.train.skipped + f.test.skipped);
        for file in f.train.files.iter().take(a.show) {
            let shown = store::reader(&file.path)
                .map_err(|e| e.to_string())
                .and_then(|r| image::ImageReader::new(r).with_guessed_format().map_err(|e| e.to_string()))
                .and_then(|r| r.decode().map_err(|e| e.to_string()))
                .map(|i| format!("{}×{} {:?}", i.width(), i.height(), i.color()))
                .unwrap_or_else(|e| format!("cannot be decoded: {e}"));
            println!("  {} (class {}): {shown}", file.path.display(), f.train.classes[file.label as usize]);
        }
    } else {
        let set = ShardSet::open(&a.path, None).with_context(|| format!("inspecting {}", a.path))?;
        println!("shards {} ({} file(s))", a.path, set.shards.len());
        println!("classes: {}", set.classes);
        println!("samples: {}", set.total());
        println!("skipped: {}", set.skipped);
        for (key, size) in set.peek(a.show)? {
            println!("  {key}: {size}");
        }
    }
    Ok(())
}

fn upload(a: UploadArgs) -> anyhow::Result<()> {
    let to = std::path::Path::new(&a.destination);
    if !store::is_remote(to) {
        anyhow::bail!(
            "{}: upload writes to object storage, s3://<bucket>/<prefix>; to copy between local folders use cp",
            a.destination
        );
    }
    let (objects, bytes) = store::upload(&a.source, to)
        .with_context(|| format!("uploading {} to {}", a.source.display(), a.destination))?;
    println!("uploaded {objects} file(s), {bytes} bytes, from {} to {}", a.source.display(), a.destination);
    Ok(())
}

fn export(a: ExportArgs) -> anyhow::Result<()> {
    let source: DataSource = serde_yaml::from_str(&a.name).with_context(|| format!("data set {}", a.name))?;
    let spec = DataSpec { source, ..DataSpec::default() };
    let splits = data::load(&spec, &a.data_dir, 0).with_context(|| format!("loading {}", a.name))?;
    for (part, set) in [("train", &splits.train), ("test", &splits.test)] {
        let (w, h) = (set.shape.width as u32, set.shape.height as u32);
        for i in 0..set.len() {
            let dir = a.output.join(part).join(set.targets(i)[0].to_string());
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let pixels = set.sample(i).iter().map(|v| (v * 255.0).round().clamp(0.0, 255.0) as u8).collect();
            let file = dir.join(format!("{i:05}.png"));
            image::GrayImage::from_raw(w, h, pixels)
                .context("a sample's size does not match its shape")?
                .save(&file)
                .with_context(|| format!("writing {}", file.display()))?;
        }
    }
    println!(
        "wrote {} training and {} test images of {} into {}",
        splits.train.len(),
        splits.test.len(),
        a.name,
        a.output.display()
    );
    Ok(())
}
