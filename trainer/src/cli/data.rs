//! `tandem data`: turn an image folder into tar shards (`pack`), and count and check a data set
//! (`inspect`).

use std::path::PathBuf;

use anyhow::Context;
use tandem::compute::data::images::{self, Sizing};
use tandem::compute::data::shards::{self, ShardSet};

/// The `tandem data` subcommands.
#[derive(clap::Subcommand)]
pub enum Data {
    /// Write an image folder (<root>/<class>/<file>.png|jpg, or <root>/train and <root>/test) as
    /// WebDataset tar shards: train-000000.tar, … and test-000000.tar, …
    Pack(PackArgs),
    /// Count the samples and classes of an image folder or tar shards and decode a few images.
    Inspect(InspectArgs),
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
    /// An image folder, a folder of .tar shards, a shard or a pattern such as train-{000..009}.tar.
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
    }
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
    let is_folder_of_images = path.is_dir() && shards::shard_paths(&a.path).is_err();
    if is_folder_of_images {
        let f = images::open(path, None, Sizing::First).with_context(|| format!("inspecting {}", a.path))?;
        println!("image folder {}", a.path);
        println!("classes: {} ({})", f.train.classes.len(), f.train.classes.join(", "));
        println!("training samples: {}", f.train.files.len());
        println!("test samples: {}", f.test.files.len());
        println!("skipped: {}", f.train.skipped + f.test.skipped);
        for file in f.train.files.iter().take(a.show) {
            let shown = image::ImageReader::open(&file.path)
                .map_err(|e| e.to_string())
                .and_then(|r| r.with_guessed_format().map_err(|e| e.to_string()))
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
