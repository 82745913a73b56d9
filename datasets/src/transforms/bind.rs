//! Binding parsed calls to transforms: torchvision's parameter names, order, defaults and
//! argument checks.

use super::parse::{Call, Value, as_f64};
use super::{KNOWN, MAX_PADDING, MAX_SIDE, PaddingMode, ResizeTo, Transform, TransformError};

/// Arguments of one call, bound to a transform's parameter names.
struct Args {
    transform: &'static str,
    values: Vec<(&'static str, Value)>,
}

impl Args {
    fn bind(
        call: Call,
        transform: &'static str,
        params: &[&'static str],
    ) -> Result<Self, TransformError> {
        if call.positional.len() > params.len() {
            return Err(TransformError::Arguments {
                transform,
                message: format!(
                    "takes at most {} positional arguments ({}), got {}",
                    params.len(),
                    params.join(", "),
                    call.positional.len()
                ),
            });
        }
        let mut values: Vec<(&'static str, Value)> =
            params.iter().copied().zip(call.positional).collect();
        for (key, value) in call.keyword {
            let Some(&param) = params.iter().find(|p| **p == key) else {
                if matches!(key.as_str(), "interpolation" | "antialias" | "max_size") {
                    return Err(TransformError::Unsupported {
                        transform,
                        argument: key,
                        why: "ladle resamples bilinearly with antialiasing, TrivialAugmentWide by nearest",
                    });
                }
                return Err(TransformError::UnknownArgument {
                    transform,
                    argument: key,
                });
            };
            if values.iter().any(|(p, _)| *p == param) {
                return Err(TransformError::Arguments {
                    transform,
                    message: format!("argument {param:?} given twice"),
                });
            }
            values.push((param, value));
        }
        Ok(Self { transform, values })
    }

    fn get(&self, name: &str) -> Option<&Value> {
        self.values
            .iter()
            .find(|(p, _)| *p == name)
            .map(|(_, v)| v)
            .filter(|v| **v != Value::None)
    }

    fn bad(&self, argument: &'static str, message: impl Into<String>) -> TransformError {
        TransformError::BadArgument {
            transform: self.transform,
            argument,
            message: message.into(),
        }
    }

    fn required(&self, name: &'static str) -> Result<&Value, TransformError> {
        self.get(name).ok_or(TransformError::Missing {
            transform: self.transform,
            argument: name,
        })
    }

    fn side(&self, name: &'static str, v: &Value) -> Result<u32, TransformError> {
        match *v {
            Value::Int(i) if (1..=i64::from(MAX_SIDE)).contains(&i) => Ok(i as u32),
            Value::Int(i) => Err(self.bad(name, format!("must be in 1..={MAX_SIDE}, not {i}"))),
            ref other => Err(self.bad(
                name,
                format!(
                    "must be an integer or a (height, width) pair, not {}",
                    other.kind()
                ),
            )),
        }
    }

    /// torchvision's `_setup_size`: an int, or a sequence of one or two ints.
    fn size(&self) -> Result<(u32, u32), TransformError> {
        let v = self.required("size")?;
        match v {
            Value::Seq(items) if items.len() == 1 => {
                let s = self.side("size", &items[0])?;
                Ok((s, s))
            }
            Value::Seq(items) if items.len() == 2 => {
                Ok((self.side("size", &items[0])?, self.side("size", &items[1])?))
            }
            Value::Seq(items) => Err(self.bad(
                "size",
                format!("must have 1 or 2 values, not {}", items.len()),
            )),
            other => {
                let s = self.side("size", other)?;
                Ok((s, s))
            }
        }
    }

    fn pair(&self, name: &'static str, default: (f64, f64)) -> Result<(f64, f64), TransformError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::Seq(items)) if items.len() == 2 => {
                let (a, b) = (as_f64(&items[0]), as_f64(&items[1]));
                if a.is_finite() && b.is_finite() {
                    Ok((a, b))
                } else {
                    Err(self.bad(name, "must be a pair of finite numbers"))
                }
            }
            Some(_) => Err(self.bad(name, "must be a pair of numbers (min, max)")),
        }
    }

    fn probability(&self, default: f64) -> Result<f64, TransformError> {
        match self.get("p") {
            None => Ok(default),
            Some(v @ (Value::Int(_) | Value::Float(_))) => {
                let p = as_f64(v);
                if (0.0..=1.0).contains(&p) {
                    Ok(p)
                } else {
                    Err(self.bad("p", format!("must be in [0, 1], not {p}")))
                }
            }
            Some(other) => Err(self.bad("p", format!("must be a number, not {}", other.kind()))),
        }
    }

    fn bool(&self, name: &'static str) -> Result<bool, TransformError> {
        match self.get(name) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => {
                Err(self.bad(name, format!("must be True or False, not {}", other.kind())))
            }
        }
    }

    fn padding(&self) -> Result<[u32; 4], TransformError> {
        let one = |v: &Value| -> Result<u32, TransformError> {
            match *v {
                Value::Int(i) if i < 0 => Err(self.bad("padding", "must be ≥ 0")),
                Value::Int(i) if i > i64::from(MAX_PADDING) => {
                    Err(self.bad("padding", format!("must be ≤ {MAX_PADDING}")))
                }
                Value::Int(i) => Ok(i as u32),
                ref other => {
                    Err(self.bad("padding", format!("must be integers, not {}", other.kind())))
                }
            }
        };
        match self.get("padding") {
            None => Ok([0; 4]),
            Some(Value::Seq(items)) => match items.len() {
                1 => Ok([one(&items[0])?; 4]),
                2 => {
                    let (lr, tb) = (one(&items[0])?, one(&items[1])?);
                    Ok([lr, tb, lr, tb])
                }
                4 => Ok([
                    one(&items[0])?,
                    one(&items[1])?,
                    one(&items[2])?,
                    one(&items[3])?,
                ]),
                n => Err(self.bad("padding", format!("must have 1, 2 or 4 values, not {n}"))),
            },
            Some(v) => Ok([one(v)?; 4]),
        }
    }

    fn fill(&self) -> Result<[u8; 3], TransformError> {
        let one = |v: &Value| -> Result<u8, TransformError> {
            match *v {
                Value::Int(i) => u8::try_from(i)
                    .map_err(|_| self.bad("fill", format!("must be in 0..=255, not {i}"))),
                ref other => {
                    Err(self.bad("fill", format!("must be integers, not {}", other.kind())))
                }
            }
        };
        match self.get("fill") {
            None => Ok([0; 3]),
            Some(Value::Seq(items)) if items.len() == 3 => {
                Ok([one(&items[0])?, one(&items[1])?, one(&items[2])?])
            }
            Some(Value::Seq(items)) if items.len() == 1 => Ok([one(&items[0])?; 3]),
            Some(Value::Seq(_)) => {
                Err(self.bad("fill", "must be one value or an (r, g, b) triple"))
            }
            Some(v) => Ok([one(v)?; 3]),
        }
    }

    fn padding_mode(&self) -> Result<PaddingMode, TransformError> {
        match self.get("padding_mode") {
            None => Ok(PaddingMode::Constant),
            Some(Value::Str(s)) => match s.as_str() {
                "constant" => Ok(PaddingMode::Constant),
                "edge" => Ok(PaddingMode::Edge),
                "reflect" => Ok(PaddingMode::Reflect),
                "symmetric" => Ok(PaddingMode::Symmetric),
                other => Err(self.bad(
                    "padding_mode",
                    format!("must be constant, edge, reflect or symmetric, not {other:?}"),
                )),
            },
            Some(other) => Err(self.bad(
                "padding_mode",
                format!("must be a string, not {}", other.kind()),
            )),
        }
    }

    /// torchvision `ColorJitter._check_input`.
    fn jitter(
        &self,
        name: &'static str,
        center: f64,
        bound: (f64, f64),
        clip_first_on_zero: bool,
    ) -> Result<Option<(f64, f64)>, TransformError> {
        let range = match self.get(name) {
            None => return Ok(None),
            Some(v @ (Value::Int(_) | Value::Float(_))) => {
                let x = as_f64(v);
                if bound.1.is_finite() && !(0.0..=bound.1).contains(&x) {
                    return Err(self.bad(name, format!("must be in [0, {}], not {x}", bound.1)));
                }
                if !(x >= 0.0 && x.is_finite()) {
                    return Err(self.bad(name, format!("must be ≥ 0, not {x}")));
                }
                let lo = center - x;
                (
                    if clip_first_on_zero { lo.max(0.0) } else { lo },
                    center + x,
                )
            }
            Some(Value::Seq(items)) if items.len() == 2 => (as_f64(&items[0]), as_f64(&items[1])),
            Some(_) => return Err(self.bad(name, "must be a number or a pair (min, max)")),
        };
        if !(bound.0 <= range.0 && range.0 <= range.1 && range.1 <= bound.1) {
            let bound_text = if bound.1.is_finite() {
                format!("[{}, {}]", bound.0, bound.1)
            } else {
                format!("[{}, inf)", bound.0)
            };
            return Err(self.bad(
                name,
                format!(
                    "must be in {bound_text} (as min ≤ max), not ({}, {})",
                    range.0, range.1
                ),
            ));
        }
        Ok((range != (center, center)).then_some(range))
    }
}

/// Resolves one call to a transform with torchvision's parameter names and defaults.
pub(super) fn bind(call: Call) -> Result<Transform, TransformError> {
    let (name, params): (&'static str, &[&'static str]) = match call.name.as_str() {
        "RandomResizedCrop" => ("RandomResizedCrop", &["size", "scale", "ratio"]),
        "RandomCrop" => (
            "RandomCrop",
            &["size", "padding", "pad_if_needed", "fill", "padding_mode"],
        ),
        "Resize" => ("Resize", &["size"]),
        "CenterCrop" => ("CenterCrop", &["size"]),
        "RandomHorizontalFlip" => ("RandomHorizontalFlip", &["p"]),
        "RandomVerticalFlip" => ("RandomVerticalFlip", &["p"]),
        "ColorJitter" => (
            "ColorJitter",
            &["brightness", "contrast", "saturation", "hue"],
        ),
        "RandomGrayscale" => ("RandomGrayscale", &["p"]),
        "TrivialAugmentWide" => ("TrivialAugmentWide", &["num_magnitude_bins", "fill"]),
        _ => {
            return Err(TransformError::UnknownTransform {
                name: call.name,
                known: KNOWN.into(),
            });
        }
    };
    let args = Args::bind(call, name, params)?;
    Ok(match name {
        "RandomResizedCrop" => {
            let size = args.size()?;
            let scale = args.pair("scale", (0.08, 1.0))?;
            let ratio = args.pair("ratio", (3.0 / 4.0, 4.0 / 3.0))?;
            if !(scale.0 > 0.0 && scale.0 <= scale.1 && scale.1 <= 1.0) {
                return Err(args.bad("scale", "must be (min, max) with 0 < min ≤ max ≤ 1"));
            }
            if !(ratio.0 > 0.0 && ratio.0 <= ratio.1) {
                return Err(args.bad("ratio", "must be (min, max) with 0 < min ≤ max"));
            }
            Transform::RandomResizedCrop { size, scale, ratio }
        }
        "RandomCrop" => Transform::RandomCrop {
            size: args.size()?,
            padding: args.padding()?,
            pad_if_needed: args.bool("pad_if_needed")?,
            fill: args.fill()?,
            padding_mode: args.padding_mode()?,
        },
        "Resize" => {
            let v = args.required("size")?;
            let size = match v {
                Value::Seq(items) if items.len() == 1 => {
                    ResizeTo::Shorter(args.side("size", &items[0])?)
                }
                Value::Seq(_) => {
                    let (h, w) = args.size()?;
                    ResizeTo::Exact(h, w)
                }
                other => ResizeTo::Shorter(args.side("size", other)?),
            };
            Transform::Resize { size }
        }
        "CenterCrop" => Transform::CenterCrop { size: args.size()? },
        "RandomHorizontalFlip" => Transform::RandomHorizontalFlip {
            p: args.probability(0.5)?,
        },
        "RandomVerticalFlip" => Transform::RandomVerticalFlip {
            p: args.probability(0.5)?,
        },
        "RandomGrayscale" => Transform::RandomGrayscale {
            p: args.probability(0.1)?,
        },
        "TrivialAugmentWide" => Transform::TrivialAugmentWide {
            num_magnitude_bins: match args.get("num_magnitude_bins") {
                None => 31,
                Some(Value::Int(n)) if (2..=1024).contains(n) => *n as u32,
                Some(_) => {
                    return Err(args.bad("num_magnitude_bins", "must be an integer in 2..=1024"));
                }
            },
            fill: args.fill()?,
        },
        _ => Transform::ColorJitter {
            brightness: args.jitter("brightness", 1.0, (0.0, f64::INFINITY), true)?,
            contrast: args.jitter("contrast", 1.0, (0.0, f64::INFINITY), true)?,
            saturation: args.jitter("saturation", 1.0, (0.0, f64::INFINITY), true)?,
            hue: args.jitter("hue", 0.0, (-0.5, 0.5), false)?,
        },
    })
}
