//! Image transforms of `images` and `shards` (`data.augment`, `data.normalize`,
//! `data.evalResize`): a training sample gets a random resized crop or a pad-and-crop, a
//! horizontal flip, then the per-channel normalisation; a test sample is resized (its shorter
//! side to `evalResize`, then centre-cropped, or exactly to the sample size) and normalised.
//!
//! Guarantees:
//! - Reproducible: a training sample's random draws come from a generator derived from (training
//!   seed, epoch, the sample's identity in the data set) only, so they do not depend on the rank,
//!   the number of ranks or the decoding threads, and a resumed run draws what an uninterrupted one
//!   would.
//! - The output is always the sample shape, channel-major, in [0, 1] before normalisation.
//! - With no `data.augment`, a training image is decoded exactly as a test image.

use image::DynamicImage;
use image::imageops::FilterType;
use tandem_api::DataSpec;

use super::{DataError, InputShape};
use tandem_util::rng::Rng;

/// The crop of a training image.
#[derive(Clone, Debug, PartialEq)]
pub enum Crop {
    /// None: the image is resized to the sample size.
    None,
    /// A random part of `scale` of the area and width ÷ height in `ratio`, resized to the sample
    /// size (torchvision's `RandomResizedCrop`).
    RandomResized {
        /// Least and most fraction of the area.
        scale: (f64, f64),
        /// Least and most width ÷ height.
        ratio: (f64, f64),
    },
    /// The resized image padded with `0` zeros on every side, then a random crop of the sample size.
    Pad(u32),
}

/// What is done to every image of a job (see the module documentation).
#[derive(Clone, Debug, PartialEq)]
pub struct Transform {
    /// The sample shape every image becomes.
    pub shape: InputShape,
    /// The training crop.
    pub crop: Crop,
    /// Whether training images are mirrored with probability ½.
    pub flip: bool,
    /// Per-channel (mean, std), one per channel of `shape`.
    pub normalize: Option<(Vec<f32>, Vec<f32>)>,
    /// A test image's shorter side before its centre crop.
    pub eval_resize: Option<u32>,
    /// The training seed.
    pub seed: u64,
}

impl Transform {
    /// Resizing to `shape` only: what a plain decode does.
    pub fn plain(shape: InputShape) -> Self {
        Self { shape, crop: Crop::None, flip: false, normalize: None, eval_resize: None, seed: 0 }
    }

    /// The transforms `spec` asks for, for samples of `shape`, seeded by `seed`; a
    /// normalisation whose values do not match the channels is refused.
    pub fn of(spec: &DataSpec, shape: InputShape, seed: u64) -> Result<Self, DataError> {
        let augment = spec.augment.clone().unwrap_or_default();
        let crop = match (&augment.random_resized_crop, augment.pad_crop) {
            (Some(r), _) => Crop::RandomResized {
                scale: (r.scale.first().copied().unwrap_or(0.08), r.scale.get(1).copied().unwrap_or(1.0)),
                ratio: (
                    r.ratio.first().copied().unwrap_or(0.75),
                    r.ratio.get(1).copied().unwrap_or(4.0 / 3.0),
                ),
            },
            (None, Some(p)) => Crop::Pad(p),
            (None, None) => Crop::None,
        };
        let normalize = match &spec.normalize {
            None => None,
            Some(n) => {
                let c = shape.channels;
                let per_channel = |v: &[f64]| -> Option<Vec<f32>> {
                    match v.len() {
                        1 => Some(vec![v[0] as f32; c]),
                        k if k == c => Some(v.iter().map(|&x| x as f32).collect()),
                        _ => None,
                    }
                };
                match (per_channel(&n.mean), per_channel(&n.std)) {
                    (Some(mean), Some(std)) if std.iter().all(|&s| s > 0.0) => Some((mean, std)),
                    _ => {
                        return Err(DataError::Config(format!(
                            "data.normalize has {} mean(s) and {} std(s), but the images have {c} channel(s) \
                             (std above 0): give one value per channel, or one for all",
                            n.mean.len(),
                            n.std.len()
                        )));
                    }
                }
            }
        };
        Ok(Self {
            shape,
            crop,
            flip: augment.horizontal_flip,
            normalize,
            eval_resize: spec.eval_resize,
            seed,
        })
    }

    /// Whether training samples draw random numbers.
    pub fn is_random(&self) -> bool {
        self.crop != Crop::None || self.flip
    }

    /// The generator of sample `id`'s draws in `epoch`.
    pub fn rng(&self, epoch: u64, id: u64) -> Rng {
        Rng::derive(self.seed ^ 0xa06e_47c3, epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ id)
    }

    /// A training sample: `image` cropped, resized, flipped and normalised as drawn for sample
    /// `id` in `epoch`, appended to `out`.
    pub fn train(&self, image: DynamicImage, epoch: u64, id: u64, out: &mut Vec<f32>) {
        let (w, h) = (self.shape.width as u32, self.shape.height as u32);
        let mut rng = self.rng(epoch, id);
        let image = match self.crop {
            Crop::RandomResized { scale, ratio } => {
                let (x, y, cw, ch) =
                    random_resized_box(image.width(), image.height(), scale, ratio, &mut rng);
                resize(&image.crop_imm(x, y, cw, ch), w, h)
            }
            _ => resize(&image, w, h),
        };
        let start = out.len();
        append_pixels(&image, self.shape.channels, out);
        let sample = &mut out[start..];
        if let Crop::Pad(pad) = self.crop {
            let span = 2 * pad as u64 + 1;
            let (dx, dy) = (rng.below(span) as usize, rng.below(span) as usize);
            pad_crop(sample, self.shape, pad as usize, dx, dy);
        }
        if self.flip && rng.next_u64() >> 63 == 1 {
            flip(sample, self.shape);
        }
        self.normalize_in_place(sample);
    }

    /// A test sample: `image` resized (shorter side to `eval_resize` then centre-cropped, or
    /// exactly to the sample size) and normalised, appended to `out`.
    pub fn eval(&self, image: DynamicImage, out: &mut Vec<f32>) {
        let (w, h) = (self.shape.width as u32, self.shape.height as u32);
        let image = match self.eval_resize {
            Some(short) => resize_and_centre_crop(&image, short, w, h),
            None => resize(&image, w, h),
        };
        let start = out.len();
        append_pixels(&image, self.shape.channels, out);
        self.normalize_in_place(&mut out[start..]);
    }

    fn normalize_in_place(&self, sample: &mut [f32]) {
        if let Some((mean, std)) = &self.normalize {
            normalize(sample, self.shape, mean, std);
        }
    }
}

/// `image` at (w, h): itself when it has that size, else resized with a triangle filter.
fn resize(image: &DynamicImage, w: u32, h: u32) -> DynamicImage {
    if (image.width(), image.height()) == (w, h) {
        image.clone()
    } else {
        image.resize_exact(w, h, FilterType::Triangle)
    }
}

/// `image` resized so that its shorter side is `short` (the aspect ratio kept), then its centre
/// `w` × `h`.
pub fn resize_and_centre_crop(image: &DynamicImage, short: u32, w: u32, h: u32) -> DynamicImage {
    let (iw, ih) = (image.width().max(1), image.height().max(1));
    let (rw, rh) = if iw <= ih {
        (short, ((ih as u64 * short as u64 + iw as u64 / 2) / iw as u64).max(1) as u32)
    } else {
        (((iw as u64 * short as u64 + ih as u64 / 2) / ih as u64).max(1) as u32, short)
    };
    let resized = resize(image, rw, rh);
    let (cw, ch) = (w.min(rw), h.min(rh));
    let cropped = resized.crop_imm((rw - cw) / 2, (rh - ch) / 2, cw, ch);
    resize(&cropped, w, h)
}

/// The part (x, y, width, height) of a `w` × `h` image that a random resized crop takes:
/// torchvision's draw (up to ten tries of an area in `scale` and a log-uniform aspect ratio in
/// `ratio` that fits), else the largest centred part whose ratio lies in `ratio`.
pub fn random_resized_box(
    w: u32,
    h: u32,
    scale: (f64, f64),
    ratio: (f64, f64),
    rng: &mut Rng,
) -> (u32, u32, u32, u32) {
    let area = w as f64 * h as f64;
    let (log_lo, log_hi) = (ratio.0.ln(), ratio.1.ln());
    for _ in 0..10 {
        let target = area * (scale.0 + (scale.1 - scale.0) * rng.next_f32() as f64);
        let aspect = (log_lo + (log_hi - log_lo) * rng.next_f32() as f64).exp();
        let cw = (target * aspect).sqrt().round() as u32;
        let ch = (target / aspect).sqrt().round() as u32;
        if cw > 0 && ch > 0 && cw <= w && ch <= h {
            let x = rng.below(u64::from(w - cw + 1)) as u32;
            let y = rng.below(u64::from(h - ch + 1)) as u32;
            return (x, y, cw, ch);
        }
    }
    let in_ratio = w as f64 / h.max(1) as f64;
    let (cw, ch) = if in_ratio < ratio.0 {
        (w, ((w as f64 / ratio.0).round() as u32).clamp(1, h))
    } else if in_ratio > ratio.1 {
        (((h as f64 * ratio.1).round() as u32).clamp(1, w), h)
    } else {
        (w, h)
    };
    ((w - cw) / 2, (h - ch) / 2, cw, ch)
}

/// Pads the C × H × W `sample` with `pad` zeros on every side and takes the H × W window whose
/// top-left corner is (`dx`, `dy`) of the padded image (`dx`, `dy` in `0..=2·pad`), in place.
pub fn pad_crop(sample: &mut [f32], shape: InputShape, pad: usize, dx: usize, dy: usize) {
    let (h, w) = (shape.height, shape.width);
    let source = sample.to_vec();
    for c in 0..shape.channels {
        let plane = &source[c * h * w..(c + 1) * h * w];
        for y in 0..h {
            for x in 0..w {
                // Output (x, y) is padded (x + dx, y + dy), which is source (x + dx − pad, y + dy − pad).
                let (sx, sy) = ((x + dx).checked_sub(pad), (y + dy).checked_sub(pad));
                sample[c * h * w + y * w + x] = match (sx, sy) {
                    (Some(sx), Some(sy)) if sx < w && sy < h => plane[sy * w + sx],
                    _ => 0.0,
                };
            }
        }
    }
}

/// Mirrors the C × H × W `sample` left to right, in place.
pub fn flip(sample: &mut [f32], shape: InputShape) {
    for row in sample.chunks_exact_mut(shape.width.max(1)) {
        row.reverse();
    }
}

/// `(x − mean[c]) / std[c]` for every value of channel `c` of the C × H × W `sample`, in place.
pub fn normalize(sample: &mut [f32], shape: InputShape, mean: &[f32], std: &[f32]) {
    let plane = shape.height * shape.width;
    for (c, values) in sample.chunks_exact_mut(plane.max(1)).enumerate() {
        let (m, inv) = (mean[c], 1.0 / std[c]);
        for v in values {
            *v = (*v - m) * inv;
        }
    }
}

/// Appends `image`'s pixels scaled to [0, 1]: grey (one channel) or RGB planes (alpha dropped).
pub(crate) fn append_pixels(image: &DynamicImage, channels: usize, out: &mut Vec<f32>) {
    const SCALE: f32 = 1.0 / 255.0;
    if channels == 1 {
        out.extend(image.to_luma8().as_raw().iter().map(|&v| v as f32 * SCALE));
    } else {
        let rgb = image.to_rgb8();
        for c in 0..3 {
            out.extend(rgb.as_raw().chunks_exact(3).map(|px| px[c] as f32 * SCALE));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GREY_2X3: InputShape = InputShape { channels: 1, height: 2, width: 3 };

    fn grey(w: u32, h: u32, values: &[u8]) -> DynamicImage {
        DynamicImage::ImageLuma8(image::GrayImage::from_raw(w, h, values.to_vec()).unwrap())
    }

    #[test]
    fn flip_mirrors_every_row_of_every_channel() {
        let mut s = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        flip(&mut s, GREY_2X3);
        assert_eq!(s, [3.0, 2.0, 1.0, 6.0, 5.0, 4.0]);
        let rgb = InputShape { channels: 2, height: 1, width: 2 };
        let mut s = vec![1.0, 2.0, 3.0, 4.0];
        flip(&mut s, rgb);
        assert_eq!(s, [2.0, 1.0, 4.0, 3.0]);
    }

    #[test]
    fn pad_crop_shifts_the_image_in_a_frame_of_zeros() {
        // 1 × 2 × 3, padded by 1 to 4 × 5:
        //   0 0 0 0 0
        //   0 1 2 3 0
        //   0 4 5 6 0
        //   0 0 0 0 0
        let s = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let at = |dx, dy| {
            let mut v = s.to_vec();
            pad_crop(&mut v, GREY_2X3, 1, dx, dy);
            v
        };
        assert_eq!(at(1, 1), s, "the centre window is the image");
        assert_eq!(at(0, 0), [0.0, 0.0, 0.0, 0.0, 1.0, 2.0]);
        assert_eq!(at(2, 2), [5.0, 6.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(at(2, 0), [0.0, 0.0, 0.0, 2.0, 3.0, 0.0]);
    }

    #[test]
    fn normalize_uses_each_channels_mean_and_std() {
        let shape = InputShape { channels: 2, height: 1, width: 2 };
        let mut s = vec![0.5, 1.0, 0.25, 0.75];
        normalize(&mut s, shape, &[0.5, 0.25], &[0.5, 0.25]);
        assert_eq!(s, [0.0, 1.0, 0.0, 2.0]);
    }

    #[test]
    fn eval_resize_keeps_the_aspect_ratio_and_takes_the_centre() {
        // 4 × 2 (w × h): the shorter side is already 2, so the centre 2 × 2 are columns 1 and 2.
        let img = grey(4, 2, &[10, 20, 30, 40, 50, 60, 70, 80]);
        let out = resize_and_centre_crop(&img, 2, 2, 2);
        assert_eq!(out.to_luma8().as_raw(), &[20, 30, 60, 70]);
        // 2 × 6 to a shorter side of 1: 1 × 3, whose centre pixel is the middle third's mean.
        let tall = grey(2, 6, &[0, 0, 0, 0, 90, 90, 90, 90, 0, 0, 0, 0]);
        let out = resize_and_centre_crop(&tall, 1, 1, 1);
        assert_eq!((out.width(), out.height()), (1, 1));
        assert!(out.to_luma8().as_raw()[0] >= 60, "{:?}", out.to_luma8().as_raw());
    }

    #[test]
    fn a_random_resized_crop_of_the_whole_area_at_its_own_ratio_is_the_image() {
        let mut rng = Rng::new(3);
        for _ in 0..20 {
            assert_eq!(random_resized_box(6, 4, (1.0, 1.0), (1.5, 1.5), &mut rng), (0, 0, 6, 4));
        }
        // Half the area at ratio 1 of a 4 × 2 image: a 2 × 2 (sqrt(4) = 2) square at x 0..=2, y 0.
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let (x, y, w, h) = random_resized_box(4, 2, (0.5, 0.5), (1.0, 1.0), &mut rng);
            assert_eq!((y, w, h), (0, 2, 2));
            seen.insert(x);
        }
        assert_eq!(seen.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
        // No draw fits (the whole area at ratio 4 of a square): the centred part of ratio 4.
        assert_eq!(random_resized_box(8, 8, (1.0, 1.0), (4.0, 4.0), &mut rng), (0, 3, 8, 2));
    }

    #[test]
    fn a_crop_box_resized_to_its_own_size_keeps_its_pixels() {
        // A 2 × 2 part at (1, 1) of a 4 × 4 image, "resized" to 2 × 2, is that part exactly.
        let img = grey(4, 4, &(0..16).collect::<Vec<u8>>());
        let part = resize(&img.crop_imm(1, 1, 2, 2), 2, 2);
        assert_eq!(part.to_luma8().as_raw(), &[5, 6, 9, 10]);
    }

    #[test]
    fn draws_depend_on_seed_epoch_and_sample_only() {
        let shape = InputShape { channels: 1, height: 4, width: 4 };
        let t = Transform { crop: Crop::Pad(2), flip: true, seed: 7, ..Transform::plain(shape) };
        let img = grey(4, 4, &(0..16).map(|v| v * 10).collect::<Vec<u8>>());
        let run = |epoch, id| {
            let mut out = Vec::new();
            t.train(img.clone(), epoch, id, &mut out);
            out
        };
        assert_eq!(run(0, 5), run(0, 5));
        let differ = (0..16).filter(|&id| run(0, id) != run(1, id)).count();
        assert!(differ > 8, "the draws should change with the epoch ({differ} of 16 changed)");
        // Without augmentation a training sample is the test sample.
        let plain = Transform::plain(shape);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        plain.train(img.clone(), 3, 9, &mut a);
        plain.eval(img, &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn a_normalisation_that_does_not_fit_the_channels_is_refused() {
        let spec = DataSpec {
            normalize: Some(tandem_api::NormalizeSpec { mean: vec![0.5, 0.5], std: vec![0.2, 0.2] }),
            ..DataSpec::default()
        };
        let rgb = InputShape { channels: 3, height: 4, width: 4 };
        let err = Transform::of(&spec, rgb, 1).unwrap_err().to_string();
        assert!(err.contains("3 channel(s)") && err.contains("one value per channel"), "{err}");
        let grey = InputShape { channels: 1, ..rgb };
        let one = DataSpec {
            normalize: Some(tandem_api::NormalizeSpec { mean: vec![0.5], std: vec![0.25] }),
            ..DataSpec::default()
        };
        let t = Transform::of(&one, grey, 1).unwrap();
        assert_eq!(t.normalize, Some((vec![0.5], vec![0.25])));
    }
}
