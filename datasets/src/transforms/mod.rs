//! Declared transforms with torchvision's names, argument names, defaults and semantics.
//!
//! `ladle serve --transform SPEC` takes a pipeline written either as torchvision calls,
//!
//! ```text
//! RandomCrop(32, padding=4), RandomHorizontalFlip()
//! ```
//!
//! or as a JSON list of objects whose `"name"` is the transform and whose other keys are its
//! arguments:
//!
//! ```text
//! [{"name": "RandomCrop", "size": 32, "padding": 4}, {"name": "RandomHorizontalFlip"}]
//! ```
//!
//! # Grammar
//!
//! ```text
//! spec  := call ("," call)* ","?            (or a JSON list, if it starts with '[')
//! call  := NAME "(" (arg ("," arg)* ","?)? ")"      NAME may carry a prefix: T.RandomCrop
//! arg   := value | NAME "=" value                    positional arguments come first
//! value := INT | FLOAT | FLOAT "/" FLOAT | True | False | None | 'str' | "str"
//!        | "(" values ")" | "[" values "]"
//! ```
//!
//! Positional arguments bind in torchvision's parameter order. A bad spec is a
//! [`TransformError`] naming the transform and the argument; no input string panics.
//!
//! # Transforms
//!
//! | transform | arguments (torchvision defaults) |
//! |---|---|
//! | [`RandomResizedCrop`](https://pytorch.org/vision/stable/generated/torchvision.transforms.RandomResizedCrop.html) | `size, scale=(0.08, 1.0), ratio=(3/4, 4/3)` |
//! | [`RandomCrop`](https://pytorch.org/vision/stable/generated/torchvision.transforms.RandomCrop.html) | `size, padding=None, pad_if_needed=False, fill=0, padding_mode='constant'` (`constant`, `edge`, `reflect`, `symmetric`) |
//! | [`Resize`](https://pytorch.org/vision/stable/generated/torchvision.transforms.Resize.html) | `size` (an int matches the shorter side, `(h, w)` is exact) |
//! | [`CenterCrop`](https://pytorch.org/vision/stable/generated/torchvision.transforms.CenterCrop.html) | `size` (pads with 0 if the image is smaller) |
//! | [`RandomHorizontalFlip`](https://pytorch.org/vision/stable/generated/torchvision.transforms.RandomHorizontalFlip.html) | `p=0.5` |
//! | [`RandomVerticalFlip`](https://pytorch.org/vision/stable/generated/torchvision.transforms.RandomVerticalFlip.html) | `p=0.5` |
//! | [`ColorJitter`](https://pytorch.org/vision/stable/generated/torchvision.transforms.ColorJitter.html) | `brightness=0, contrast=0, saturation=0, hue=0` |
//! | [`RandomGrayscale`](https://pytorch.org/vision/stable/generated/torchvision.transforms.RandomGrayscale.html) | `p=0.1` |
//! | [`TrivialAugmentWide`](https://pytorch.org/vision/stable/generated/torchvision.transforms.TrivialAugmentWide.html) | `num_magnitude_bins=31, fill=None` (nearest interpolation) |
//!
//! # Semantics and where ladle differs
//!
//! - Randomness comes from [`SampleRng`](crate::rng::SampleRng) seeded with
//!   `(seed, epoch, index)`, one stream per sample drawn in pipeline order, so a sample is
//!   transformed identically on every run; the values differ from torch's generator.
//! - Resampling is bilinear with antialiasing (torchvision's default `antialias=True`) by
//!   `fast_image_resize`. `RandomResizedCrop` crops, then resamples the crop alone (pixels
//!   outside the box never contribute, as in torchvision's `resized_crop`). `Resize` directly
//!   followed by a `CenterCrop` that fits is fused into one resampling of the source region
//!   that torchvision's crop, at its integer offset `round((n - crop) / 2)`, takes of the
//!   resized image, so the result is torchvision's resize-then-crop up to resampling rounding.
//! - Checked against torchvision on real photographs with the same drawn parameters
//!   (`benches/python/test_transforms_parity.py`, table in `benches/README.md`): crops,
//!   padding in every mode, flips, brightness, hue and eleven of TrivialAugmentWide's fourteen
//!   operations are byte-identical to torchvision's tensor path; resampling is within 1 level;
//!   contrast, saturation, grayscale and TrivialAugmentWide's `Color`/`Contrast` within 1
//!   level (the grayscale weights below; chained in `ColorJitter`, a contrast factor can
//!   amplify it to a few levels), `Sharpness` within 1 level on a few pixels in a thousand.
//!   [`Transformer::apply_traced`] reports the draws.
//! - `RandomCrop`'s draws follow torchvision's `get_params` (top, then left; no draw when the
//!   crop is the whole image); `pad_if_needed` pads each side by the missing width (height),
//!   as torchvision does. `reflect` and `symmetric` accept padding larger than the image
//!   (NumPy's repeated reflection, torchvision's PIL path).
//! - `ColorJitter` draws torchvision's random order of its four adjustments (a Fisher–Yates
//!   permutation), then the brightness, contrast, saturation and hue factors in that fixed
//!   order, and applies the adjustments in the drawn order with torchvision's tensor
//!   formulas: blends truncated to u8, contrast against the mean of the grayscale image, hue
//!   through torchvision's `_rgb2hsv`/`_hsv2rgb` in f32 and back to u8 as its
//!   `convert_image_dtype` (times 255.999, truncated).
//! - Grayscale (`RandomGrayscale` and the contrast/saturation references) uses the weights
//!   0.299/0.587/0.114 in 16-bit fixed point with rounding (PIL's `convert("L")`, which gray
//!   pixels survive unchanged), not the tensor path's truncated 0.2989.
//! - `TrivialAugmentWide` draws the operation, then the bin, then the sign, as torchvision's
//!   `forward`, and follows torchvision's u8 tensor implementation of each of its fourteen
//!   operations (affine ops by nearest sampling in f32 as `grid_sample`, sharpness's rounded
//!   3×3 smoothing, per-channel autocontrast and equalize), with its blend weights `1 + m`
//!   and exactly `-m` as torchvision's f64 arithmetic gives them.
//! - The pipeline must end in a fixed, square output size, the ring's slot: a spec whose
//!   output depends on the input image (only `Resize(256)`) or is not square is an error.
//!
//! Not supported: `interpolation`, `antialias` and `max_size` (always bilinear, antialiased),
//! `Normalize`/`ToTensor` (consumers receive u8 HWC and normalize on the GPU),
//! `RandAugment`, `AutoAugment`, `AugMix`, `RandomRotation`, `RandomAffine`,
//! `GaussianBlur`, `RandomErasing`, `RandomApply`/`RandomChoice`, non-square outputs.

mod apply;
mod bind;
mod parse;
#[cfg(test)]
mod tests;
mod trivial;

use std::fmt;

pub use apply::Transformer;

/// What one transform of a pipeline drew (or did) for one sample, as
/// [`Transformer::apply_traced`] reports it: one entry per transform, in pipeline order.
/// Sizes and positions are in pixels of the transform's input image, `(top, left)` first as
/// torchvision's `get_params` return them.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(tag = "transform")]
#[non_exhaustive]
pub enum Drawn {
    /// The crop box that was resized to the output size (`F.resized_crop`).
    RandomResizedCrop {
        /// Top edge.
        top: u32,
        /// Left edge.
        left: u32,
        /// Crop height.
        height: u32,
        /// Crop width.
        width: u32,
    },
    /// The padding applied, then the crop's corner in the padded image.
    RandomCrop {
        /// `padding` as declared, `(left, top, right, bottom)`.
        padding: [u32; 4],
        /// What `pad_if_needed` added on each side, `(x, y)`: left and right by `x`, top and
        /// bottom by `y`.
        pad_if_needed: [u32; 2],
        /// Top edge in the padded image.
        top: u32,
        /// Left edge in the padded image.
        left: u32,
    },
    /// The resized `(height, width)`.
    Resize {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
    /// The crop size; `fused` when it was done as one resampling with the preceding `Resize`.
    CenterCrop {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
        /// Resampled together with the `Resize` before it.
        fused: bool,
    },
    /// Whether the image was mirrored left to right.
    RandomHorizontalFlip {
        /// The flip happened.
        flipped: bool,
    },
    /// Whether the image was mirrored top to bottom.
    RandomVerticalFlip {
        /// The flip happened.
        flipped: bool,
    },
    /// Whether the image was made gray.
    RandomGrayscale {
        /// The conversion happened.
        applied: bool,
    },
    /// The order of the adjustments (0 brightness, 1 contrast, 2 saturation, 3 hue) and the
    /// factors drawn (`None`: not jittered).
    ColorJitter {
        /// Adjustments in the order applied.
        order: [u8; 4],
        /// Brightness factor.
        brightness: Option<f32>,
        /// Contrast factor.
        contrast: Option<f32>,
        /// Saturation factor.
        saturation: Option<f32>,
        /// Hue shift.
        hue: Option<f32>,
    },
    /// The operation (torchvision's name) and its signed magnitude (`None`: it has none).
    TrivialAugmentWide {
        /// `Identity`, `ShearX`, ..., `Equalize`.
        op: &'static str,
        /// The magnitude passed to torchvision's `_apply_op`.
        magnitude: Option<f32>,
    },
}

/// Largest side, in pixels, of any size argument.
pub const MAX_SIDE: u32 = 8192;
/// Largest padding, in pixels, on any side.
pub const MAX_PADDING: u32 = 4096;

/// A spec could not be parsed or does not describe a usable pipeline.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TransformError {
    /// The text is not a list of calls.
    #[error("syntax error at byte {at}: {message}")]
    Syntax {
        /// Byte offset into the spec.
        at: usize,
        /// What was expected.
        message: String,
    },
    /// The JSON form is malformed.
    #[error("bad JSON transform list: {0}")]
    Json(String),
    /// No transform has this name.
    #[error("unknown transform {name:?} (known: {known})")]
    UnknownTransform {
        /// The name as written.
        name: String,
        /// The supported names.
        known: String,
    },
    /// The transform has no argument of this name.
    #[error("{transform}: unknown argument {argument:?}")]
    UnknownArgument {
        /// The transform.
        transform: &'static str,
        /// The argument as written.
        argument: String,
    },
    /// The argument exists in torchvision but ladle does not support it.
    #[error("{transform}: argument {argument:?} is not supported ({why})")]
    Unsupported {
        /// The transform.
        transform: &'static str,
        /// The argument.
        argument: String,
        /// Why, and what ladle does instead.
        why: &'static str,
    },
    /// An argument was given twice, or too many positional arguments.
    #[error("{transform}: {message}")]
    Arguments {
        /// The transform.
        transform: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A required argument is missing.
    #[error("{transform}: missing required argument {argument:?}")]
    Missing {
        /// The transform.
        transform: &'static str,
        /// The argument.
        argument: &'static str,
    },
    /// An argument has the wrong type or is out of range.
    #[error("{transform}: {argument} {message}")]
    BadArgument {
        /// The transform.
        transform: &'static str,
        /// The argument.
        argument: &'static str,
        /// What it must be.
        message: String,
    },
    /// The spec has no transform.
    #[error("the transform list is empty")]
    Empty,
    /// The output size depends on the input image.
    #[error(
        "the output size is not fixed: {0}; end with a transform of fixed size such as \
         CenterCrop(N), RandomCrop(N) or RandomResizedCrop(N)"
    )]
    NotFixedSize(String),
    /// The output is not square; the ring holds `size × size × 3` samples.
    #[error("the output is {height}x{width}; the ring needs a square output (size N or (N, N))")]
    NotSquare {
        /// Output height.
        height: u32,
        /// Output width.
        width: u32,
    },
}

/// `Resize`'s target: the shorter side, or an exact `(height, width)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResizeTo {
    /// Match the shorter side, keeping the aspect ratio (torchvision `Resize(int)`).
    Shorter(u32),
    /// Exactly `(height, width)`.
    Exact(u32, u32),
}

/// `RandomCrop`'s `padding_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaddingMode {
    /// Pad with `fill`.
    Constant,
    /// Repeat the edge pixel.
    Edge,
    /// Mirror without repeating the edge: `[1 2 3 4]` padded by 2 is `[3 2 1 2 3 4 3 2]`.
    Reflect,
    /// Mirror repeating the edge: `[1 2 3 4]` padded by 2 is `[2 1 1 2 3 4 4 3]`.
    Symmetric,
}

impl PaddingMode {
    fn name(self) -> &'static str {
        match self {
            Self::Constant => "constant",
            Self::Edge => "edge",
            Self::Reflect => "reflect",
            Self::Symmetric => "symmetric",
        }
    }
}

/// One transform with every argument resolved. Sizes are `(height, width)`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Transform {
    /// torchvision `RandomResizedCrop(size, scale, ratio)`.
    RandomResizedCrop {
        /// Output `(height, width)`.
        size: (u32, u32),
        /// Range of the crop's area as a fraction of the image's.
        scale: (f64, f64),
        /// Range of the crop's aspect ratio w/h.
        ratio: (f64, f64),
    },
    /// torchvision `RandomCrop(size, padding, pad_if_needed, fill, padding_mode)`.
    RandomCrop {
        /// Output `(height, width)`.
        size: (u32, u32),
        /// Padding `(left, top, right, bottom)`.
        padding: [u32; 4],
        /// Pad each side by the missing amount if the (padded) image is smaller.
        pad_if_needed: bool,
        /// RGB fill for `PaddingMode::Constant`.
        fill: [u8; 3],
        /// How padding is filled.
        padding_mode: PaddingMode,
    },
    /// torchvision `Resize(size)`.
    Resize {
        /// The target.
        size: ResizeTo,
    },
    /// torchvision `CenterCrop(size)`.
    CenterCrop {
        /// Output `(height, width)`.
        size: (u32, u32),
    },
    /// torchvision `RandomHorizontalFlip(p)`.
    RandomHorizontalFlip {
        /// Probability of the flip.
        p: f64,
    },
    /// torchvision `RandomVerticalFlip(p)`.
    RandomVerticalFlip {
        /// Probability of the flip.
        p: f64,
    },
    /// torchvision `ColorJitter(brightness, contrast, saturation, hue)`; `None` when the
    /// range is the identity.
    ColorJitter {
        /// Brightness factor range.
        brightness: Option<(f64, f64)>,
        /// Contrast factor range.
        contrast: Option<(f64, f64)>,
        /// Saturation factor range.
        saturation: Option<(f64, f64)>,
        /// Hue shift range, within `[-0.5, 0.5]`.
        hue: Option<(f64, f64)>,
    },
    /// torchvision `RandomGrayscale(p)`.
    RandomGrayscale {
        /// Probability of converting to (3-channel) grayscale.
        p: f64,
    },
    /// torchvision `TrivialAugmentWide(num_magnitude_bins, interpolation=NEAREST, fill)`.
    TrivialAugmentWide {
        /// Number of magnitude bins (at least 2).
        num_magnitude_bins: u32,
        /// RGB fill of the area geometric operations uncover.
        fill: [u8; 3],
    },
}

const KNOWN: &str = "RandomResizedCrop, RandomCrop, Resize, CenterCrop, RandomHorizontalFlip, \
                     RandomVerticalFlip, ColorJitter, RandomGrayscale, TrivialAugmentWide";

impl Transform {
    /// The output `(height, width)` for an input of `dims`, when it does not depend on the
    /// image; `None` when unknown.
    fn output_dims(&self, dims: Option<(u32, u32)>) -> Option<(u32, u32)> {
        match *self {
            Self::RandomResizedCrop { size, .. }
            | Self::RandomCrop { size, .. }
            | Self::CenterCrop { size } => Some(size),
            Self::Resize {
                size: ResizeTo::Exact(h, w),
            } => Some((h, w)),
            Self::Resize {
                size: ResizeTo::Shorter(s),
            } => dims
                .map(|(h, w)| resized_dims(w, h, s))
                .map(|(w, h)| (h, w)),
            _ => dims,
        }
    }

    /// Whether the transform makes a new image (rather than changing pixels in place).
    fn produces(&self) -> bool {
        matches!(
            self,
            Self::RandomResizedCrop { .. }
                | Self::RandomCrop { .. }
                | Self::Resize { .. }
                | Self::CenterCrop { .. }
        )
    }
}

/// torchvision's `_compute_resized_output_size` for an int size: the shorter side becomes
/// `size`, the longer `int(size * long / short)`. Returns `(width, height)`.
pub(crate) fn resized_dims(width: u32, height: u32, size: u32) -> (u32, u32) {
    let (short, long) = if width <= height {
        (width, height)
    } else {
        (height, width)
    };
    // Saturates rather than wraps: an absurd size is then rejected as too large.
    let new_long = (u64::from(size) * u64::from(long) / u64::from(short.max(1)))
        .min(u64::from(u32::MAX)) as u32;
    if width <= height {
        (size, new_long.max(1))
    } else {
        (new_long.max(1), size)
    }
}

/// A validated transform pipeline with a fixed, square output size.
#[derive(Debug, Clone, PartialEq)]
pub struct Transforms {
    list: Vec<Transform>,
    size: u32,
}

impl Transforms {
    /// Parses a spec (see the module docs) and checks that its output is fixed and square.
    pub fn parse(spec: &str) -> Result<Self, TransformError> {
        let list = parse::parse(spec)?
            .into_iter()
            .map(bind::bind)
            .collect::<Result<Vec<_>, _>>()?;
        Self::new(list)
    }

    /// A pipeline of already-resolved transforms; checks the output size.
    pub fn new(list: Vec<Transform>) -> Result<Self, TransformError> {
        if list.is_empty() {
            return Err(TransformError::Empty);
        }
        let mut dims = None;
        for t in &list {
            dims = t.output_dims(dims);
        }
        let Some((height, width)) = dims else {
            return Err(TransformError::NotFixedSize(
                "it depends on the input image's size".into(),
            ));
        };
        if height != width {
            return Err(TransformError::NotSquare { height, width });
        }
        Ok(Self { list, size: height })
    }

    /// `RandomResizedCrop(size), RandomHorizontalFlip()`: the default training transform.
    pub fn train(size: u32) -> Self {
        Self {
            list: vec![
                Transform::RandomResizedCrop {
                    size: (size, size),
                    scale: (0.08, 1.0),
                    ratio: (3.0 / 4.0, 4.0 / 3.0),
                },
                Transform::RandomHorizontalFlip { p: 0.5 },
            ],
            size,
        }
    }

    /// `Resize(ceil(size * 256 / 224)), CenterCrop(size)`: the evaluation transform.
    pub fn eval(size: u32) -> Self {
        let resize = (u64::from(size) * 256).div_ceil(224) as u32;
        Self {
            list: vec![
                Transform::Resize {
                    size: ResizeTo::Shorter(resize),
                },
                Transform::CenterCrop { size: (size, size) },
            ],
            size,
        }
    }

    /// The transforms in order.
    pub fn list(&self) -> &[Transform] {
        &self.list
    }

    /// Output side in pixels.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Bytes one output sample occupies (`size × size × 3`).
    pub fn output_len(&self) -> usize {
        let s = self.size as usize;
        s * s * 3
    }

    /// Index of the last transform that makes a new image; later ones work in place.
    fn last_producer(&self) -> usize {
        self.list.iter().rposition(Transform::produces).unwrap_or(0)
    }
}

impl serde::Serialize for Transforms {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

struct Pair((f64, f64));

impl fmt::Display for Pair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({:?}, {:?})", self.0.0, self.0.1)
    }
}

struct Range(Option<(f64, f64)>, f64);

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(r) => Pair(r).fmt(f),
            None => write!(f, "{:?}", self.1),
        }
    }
}

impl fmt::Display for Transform {
    /// The transform with every argument spelled out; parsing it gives the same transform.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = |v: bool| if v { "True" } else { "False" };
        match self {
            Self::RandomResizedCrop { size, scale, ratio } => write!(
                f,
                "RandomResizedCrop(size=({}, {}), scale={}, ratio={})",
                size.0,
                size.1,
                Pair(*scale),
                Pair(*ratio)
            ),
            Self::RandomCrop {
                size,
                padding,
                pad_if_needed,
                fill,
                padding_mode,
            } => write!(
                f,
                "RandomCrop(size=({}, {}), padding=({}, {}, {}, {}), pad_if_needed={}, \
                 fill=({}, {}, {}), padding_mode='{}')",
                size.0,
                size.1,
                padding[0],
                padding[1],
                padding[2],
                padding[3],
                b(*pad_if_needed),
                fill[0],
                fill[1],
                fill[2],
                padding_mode.name()
            ),
            Self::Resize {
                size: ResizeTo::Shorter(s),
            } => write!(f, "Resize(size={s})"),
            Self::Resize {
                size: ResizeTo::Exact(h, w),
            } => write!(f, "Resize(size=({h}, {w}))"),
            Self::CenterCrop { size } => write!(f, "CenterCrop(size=({}, {}))", size.0, size.1),
            Self::RandomHorizontalFlip { p } => write!(f, "RandomHorizontalFlip(p={p:?})"),
            Self::RandomVerticalFlip { p } => write!(f, "RandomVerticalFlip(p={p:?})"),
            Self::ColorJitter {
                brightness,
                contrast,
                saturation,
                hue,
            } => write!(
                f,
                "ColorJitter(brightness={}, contrast={}, saturation={}, hue={})",
                Range(*brightness, 0.0),
                Range(*contrast, 0.0),
                Range(*saturation, 0.0),
                Range(*hue, 0.0)
            ),
            Self::RandomGrayscale { p } => write!(f, "RandomGrayscale(p={p:?})"),
            Self::TrivialAugmentWide {
                num_magnitude_bins,
                fill,
            } => write!(
                f,
                "TrivialAugmentWide(num_magnitude_bins={num_magnitude_bins}, fill=({}, {}, {}))",
                fill[0], fill[1], fill[2]
            ),
        }
    }
}

impl fmt::Display for Transforms {
    /// The canonical spec: equal for equal pipelines, and it parses back to this pipeline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.list.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            t.fmt(f)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Transforms {
    type Err = TransformError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}
