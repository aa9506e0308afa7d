//! Layers shared by the candle-backed model families: dense stacks and 2-D convolution of any
//! kernel size, stride and zero padding as an explicit im2col gather plus one batched matmul.
//!
//! Why im2col rather than candle's `conv2d`: candle's CPU backward of `conv2d`
//! (`conv_transpose2d`) is a scalar loop about 10× slower; the gather's backward is a scatter-add
//! and the matmul's is two GEMMs.
//!
//! Guarantees: [`Im2col::forward`] equals candle's `conv2d` (and the definition) up to float
//! rounding for every kernel, stride and padding (tested below); output sizes follow PyTorch's
//! `⌊(n + 2·padding − kernel) / stride⌋ + 1`.

use candle_core::{Device, Tensor};

use super::ModelError;

/// A 2-D convolution's geometry: `c_out` filters of `c_in × kernel.0 × kernel.1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2d {
    /// Input channels.
    pub c_in: usize,
    /// Output channels (filters).
    pub c_out: usize,
    /// Kernel height and width.
    pub kernel: (usize, usize),
    /// Step between output positions, in both directions.
    pub stride: usize,
    /// Zeros added on every side.
    pub padding: usize,
}

impl Conv2d {
    /// Output height and width for an input of `h × w`, or `None` when the kernel does not fit.
    pub fn output_size(&self, h: usize, w: usize) -> Option<(usize, usize)> {
        let (kh, kw) = self.kernel;
        let (hp, wp) = (h + 2 * self.padding, w + 2 * self.padding);
        if self.stride == 0 || kh == 0 || kw == 0 || hp < kh || wp < kw {
            return None;
        }
        Some(((hp - kh) / self.stride + 1, (wp - kw) / self.stride + 1))
    }

    /// Weights per filter (the fan-in).
    pub fn fan_in(&self) -> usize {
        self.c_in * self.kernel.0 * self.kernel.1
    }

    /// The gather indices that unfold a zero-padded `[c_in, h+2p, w+2p]` image (flattened) into
    /// `[c_in·kh·kw, oh·ow]` patch columns, row (ci, ky, kx), column (oy, ox), for inputs of
    /// `h × w` on `device`.
    pub fn im2col(&self, h: usize, w: usize, device: &Device) -> Result<Im2col, ModelError> {
        let (oh, ow) = self.output_size(h, w).ok_or_else(|| {
            ModelError::Spec(format!("a {:?} kernel does not fit a {h}×{w} input", self.kernel))
        })?;
        let (kh, kw) = self.kernel;
        let (hp, wp) = (h + 2 * self.padding, w + 2 * self.padding);
        let mut idx = Vec::with_capacity(self.fan_in() * oh * ow);
        for ci in 0..self.c_in {
            for ky in 0..kh {
                for kx in 0..kw {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let (y, x) = (oy * self.stride + ky, ox * self.stride + kx);
                            idx.push((ci * hp * wp + y * wp + x) as u32);
                        }
                    }
                }
            }
        }
        let n = idx.len();
        let index = Tensor::from_vec(idx, n, device).map_err(super::ctx("building convolution indices"))?;
        Ok(Im2col { conv: *self, input: (h, w), output: (oh, ow), index })
    }
}

/// A [`Conv2d`] prepared for one input size.
#[derive(Clone, Debug)]
pub struct Im2col {
    conv: Conv2d,
    input: (usize, usize),
    output: (usize, usize),
    index: Tensor,
}

impl Im2col {
    /// Output height and width.
    pub fn output(&self) -> (usize, usize) {
        self.output
    }

    /// The convolution of `x` (`[b, c_in, h, w]`) with filters `w` (`[c_out, c_in, kh, kw]`) plus
    /// `bias` (`[c_out]`): `[b, c_out, oh, ow]`.
    pub fn forward(&self, x: &Tensor, w: &Tensor, bias: &Tensor) -> candle_core::Result<Tensor> {
        let (b, c, h, wd) = x.dims4()?;
        let p = self.conv.padding;
        if (c, h, wd) != (self.conv.c_in, self.input.0, self.input.1) {
            candle_core::bail!(
                "convolution prepared for [{}, {}, {}] inputs got [{c}, {h}, {wd}]",
                self.conv.c_in,
                self.input.0,
                self.input.1
            );
        }
        let xp = if p > 0 { x.pad_with_zeros(2, p, p)?.pad_with_zeros(3, p, p)? } else { x.clone() };
        let (oh, ow) = self.output;
        let kk = self.conv.fan_in();
        let cols = xp.reshape((b, c * (h + 2 * p) * (wd + 2 * p)))?.index_select(&self.index, 1)?;
        let cols = cols.reshape((b, kk, oh * ow))?;
        let c_out = self.conv.c_out;
        let y = w.reshape((c_out, kk))?.broadcast_matmul(&cols)?;
        y.reshape((b, c_out, oh, ow))?.broadcast_add(&bias.reshape((1, c_out, 1, 1))?)
    }
}

/// `x · wᵀ + b` through `layers` dense layers whose weights and biases are `vars[first + 2l]` and
/// `vars[first + 2l + 1]`, with ReLU between them (not after the last).
pub fn dense_stack(x: Tensor, vars: &[&Tensor], first: usize, layers: usize) -> candle_core::Result<Tensor> {
    let mut x = x;
    for l in 0..layers {
        let (w, b) = (vars[first + 2 * l], vars[first + 2 * l + 1]);
        x = x.matmul(&w.t()?)?.broadcast_add(b)?;
        if l + 1 < layers {
            x = x.relu()?;
        }
    }
    Ok(x)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tandem_util::rng::Rng;

    fn random(rng: &mut Rng, shape: &[usize]) -> Tensor {
        let n = shape.iter().product();
        Tensor::from_vec((0..n).map(|_| rng.normal()).collect::<Vec<f32>>(), shape, &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        assert_eq!(a.dims(), b.dims());
        (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
    }

    /// The definition, one multiply-add at a time.
    fn naive(x: &Tensor, w: &Tensor, bias: &Tensor, conv: Conv2d) -> Tensor {
        let (b, c, h, wd) = x.dims4().unwrap();
        let (oh, ow) = conv.output_size(h, wd).unwrap();
        let (kh, kw) = conv.kernel;
        let xs = x.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let ws = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let bs = bias.to_vec1::<f32>().unwrap();
        let mut out = vec![0f32; b * conv.c_out * oh * ow];
        for n in 0..b {
            for co in 0..conv.c_out {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut acc = bs[co];
                        for ci in 0..c {
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let y = (oy * conv.stride + ky) as isize - conv.padding as isize;
                                    let xx = (ox * conv.stride + kx) as isize - conv.padding as isize;
                                    if y < 0 || xx < 0 || y >= h as isize || xx >= wd as isize {
                                        continue;
                                    }
                                    let xv = xs[((n * c + ci) * h + y as usize) * wd + xx as usize];
                                    acc += xv * ws[((co * c + ci) * kh + ky) * kw + kx];
                                }
                            }
                        }
                        out[((n * conv.c_out + co) * oh + oy) * ow + ox] = acc;
                    }
                }
            }
        }
        Tensor::from_vec(out, (b, conv.c_out, oh, ow), &Device::Cpu).unwrap()
    }

    #[test]
    fn convolution_of_any_kernel_stride_and_padding_equals_candle_and_the_definition() {
        let mut rng = Rng::new(1);
        let (b, h, w) = (2, 7, 6);
        // (c_in, c_out, kernel, stride, padding): today's 5×5 "same", ResNet's 3×3 and strided
        // 3×3 and 1×1 shortcuts, a 7×7 stem with stride 2, and a non-square kernel.
        let cases = [
            (2, 4, (5, 5), 1, 2),
            (3, 2, (3, 3), 1, 1),
            (3, 5, (3, 3), 2, 1),
            (4, 3, (1, 1), 2, 0),
            (1, 2, (7, 7), 2, 3),
            (2, 3, (3, 1), 1, 0),
        ];
        for (c_in, c_out, kernel, stride, padding) in cases {
            let conv = Conv2d { c_in, c_out, kernel, stride, padding };
            let x = random(&mut rng, &[b, c_in, h, w]);
            let k = random(&mut rng, &[c_out, c_in, kernel.0, kernel.1]);
            let bias = random(&mut rng, &[c_out]);
            let ours = conv.im2col(h, w, &Device::Cpu).unwrap().forward(&x, &k, &bias).unwrap();
            let definition = naive(&x, &k, &bias, conv);
            assert!(max_diff(&ours, &definition) < 1e-4, "{conv:?} against the definition");
            if kernel.0 == kernel.1 {
                let reference = x
                    .conv2d(&k, padding, stride, 1, 1)
                    .and_then(|y| y.broadcast_add(&bias.reshape((1, c_out, 1, 1))?))
                    .unwrap();
                assert!(max_diff(&ours, &reference) < 1e-4, "{conv:?} against candle's conv2d");
            }
        }
    }

    #[test]
    fn output_sizes_follow_pytorch_and_misfits_are_refused() {
        let conv = |kernel, stride, padding| Conv2d { c_in: 1, c_out: 1, kernel, stride, padding };
        assert_eq!(conv((5, 5), 1, 2).output_size(28, 28), Some((28, 28)));
        assert_eq!(conv((3, 3), 2, 1).output_size(32, 31), Some((16, 16)));
        assert_eq!(conv((7, 7), 2, 3).output_size(224, 224), Some((112, 112)));
        assert_eq!(conv((5, 5), 1, 0).output_size(4, 4), None);
        assert!(conv((5, 5), 1, 0).im2col(4, 4, &Device::Cpu).is_err());
        assert_eq!(conv((3, 3), 0, 1).output_size(8, 8), None);
    }
}
