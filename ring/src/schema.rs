//! What one sample is: a record of named fields, each a fixed-shape array of one dtype.
//!
//! A feed's [`Schema`] travels in `Welcome` (inside the [`RingLayout`](crate::RingLayout)) and
//! decides the ring's regions: one struct-of-arrays region per field, so that a batch's field
//! is one contiguous `[B, ...shape]` array. An image feed is `image: u8[H, W, 3], label: i64`
//! ([`Schema::image`]); an audio feed might be `wave: f32[16000], length: i32, label: i64`
//! (variable-length data is a fixed maximum shape plus a length field the producer fills).
//!
//! The text form, what [`Schema`]'s `Display` writes and `FromStr` reads, is the same one
//! everywhere (logs, `ladle consume`, Python's `consumer.schema`):
//! `image: u8[32, 32, 3], label: i64`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Fields a schema may have.
pub const MAX_FIELDS: usize = 32;

/// The longest field name.
pub const MAX_NAME: usize = 64;

/// Dimensions a field may have (a scalar has none).
pub const MAX_RANK: usize = 8;

/// The largest field, bytes per sample (1 GiB).
pub const MAX_FIELD_BYTES: u64 = 1 << 30;

/// The element type of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// Unsigned 16-bit integer.
    U16,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// bfloat16 (the upper half of an `f32`).
    Bf16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// One byte, 0 or 1.
    Bool,
}

impl DType {
    /// Every dtype, in the order above.
    pub const ALL: [DType; 11] = [
        DType::U8,
        DType::I8,
        DType::U16,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F16,
        DType::Bf16,
        DType::F32,
        DType::F64,
        DType::Bool,
    ];

    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 | DType::Bool => 1,
            DType::U16 | DType::I16 | DType::F16 | DType::Bf16 => 2,
            DType::I32 | DType::F32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The name used in schemas: `u8`, `bf16`, `bool`, ...
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::U16 => "u16",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::Bool => "bool",
        }
    }

    /// NumPy's name for the dtype (`uint8`, `float32`, ...); `bfloat16` has none in NumPy
    /// itself but is torch's and ml_dtypes' name.
    pub fn numpy_name(self) -> &'static str {
        match self {
            DType::U8 => "uint8",
            DType::I8 => "int8",
            DType::U16 => "uint16",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::F16 => "float16",
            DType::Bf16 => "bfloat16",
            DType::F32 => "float32",
            DType::F64 => "float64",
            DType::Bool => "bool",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = SchemaError;

    /// Reads a schema name (`f32`) or NumPy's (`float32`).
    fn from_str(s: &str) -> Result<Self, SchemaError> {
        let s = s.trim();
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s || d.numpy_name() == s)
            .ok_or_else(|| SchemaError::DType(s.to_owned()))
    }
}

/// One named field of a sample.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Field {
    /// Its name (`image`, `label`, `wave`): 1 to 64 of `A-Z a-z 0-9 _ - .`.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its shape per sample; empty for a scalar.
    pub shape: Vec<u64>,
}

impl Field {
    /// A field.
    pub fn new(name: impl Into<String>, dtype: DType, shape: impl Into<Vec<u64>>) -> Self {
        Self {
            name: name.into(),
            dtype,
            shape: shape.into(),
        }
    }

    /// Elements per sample.
    pub fn elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Bytes per sample (valid fields only: a schema checks that this does not overflow).
    pub fn bytes(&self) -> usize {
        self.elements() as usize * self.dtype.size()
    }

    fn check(&self) -> Result<(), SchemaError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= MAX_NAME
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
        if !name_ok {
            return Err(SchemaError::Name(self.name.chars().take(80).collect()));
        }
        let bad_shape = |why: &str| SchemaError::Shape {
            field: self.name.clone(),
            why: why.to_owned(),
        };
        if self.shape.len() > MAX_RANK {
            return Err(bad_shape(&format!("more than {MAX_RANK} dimensions")));
        }
        if self.shape.contains(&0) {
            return Err(bad_shape("a dimension is 0"));
        }
        let bytes = self
            .shape
            .iter()
            .try_fold(self.dtype.size() as u64, |acc, &d| acc.checked_mul(d))
            .filter(|&b| b <= MAX_FIELD_BYTES);
        if bytes.is_none() {
            return Err(bad_shape("more than 1 GiB per sample"));
        }
        Ok(())
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.dtype)?;
        if !self.shape.is_empty() {
            let dims: Vec<String> = self.shape.iter().map(u64::to_string).collect();
            write!(f, "[{}]", dims.join(", "))?;
        }
        Ok(())
    }
}

/// A sample's fields, in order; checked on construction and on deserialisation.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "Wire", into = "Wire")]
pub struct Schema {
    fields: Vec<Field>,
}

#[derive(Serialize, Deserialize)]
struct Wire {
    fields: Vec<Field>,
}

impl TryFrom<Wire> for Schema {
    type Error = SchemaError;
    fn try_from(wire: Wire) -> Result<Self, SchemaError> {
        Schema::new(wire.fields)
    }
}

impl From<Schema> for Wire {
    fn from(schema: Schema) -> Self {
        Wire {
            fields: schema.fields,
        }
    }
}

/// The name of an image feed's image field.
pub const IMAGE: &str = "image";
/// The name of an image feed's label field.
pub const LABEL: &str = "label";

impl Schema {
    /// A schema of `fields`: 1 to [`MAX_FIELDS`], unique names, shapes of at most
    /// [`MAX_RANK`] non-zero dimensions and at most 1 GiB per field per sample.
    pub fn new(fields: Vec<Field>) -> Result<Self, SchemaError> {
        if fields.is_empty() || fields.len() > MAX_FIELDS {
            return Err(SchemaError::FieldCount(fields.len()));
        }
        for (k, field) in fields.iter().enumerate() {
            field.check()?;
            if fields[..k].iter().any(|f| f.name == field.name) {
                return Err(SchemaError::Duplicate(field.name.clone()));
            }
        }
        Ok(Self { fields })
    }

    /// An image feed: `image: u8[height, width, 3], label: i64`.
    pub fn image(height: u32, width: u32) -> Result<Self, SchemaError> {
        Self::new(vec![
            Field::new(IMAGE, DType::U8, [u64::from(height), u64::from(width), 3]),
            Field::new(LABEL, DType::I64, []),
        ])
    }

    /// The fields, in order.
    pub fn fields(&self) -> &[Field] {
        &self.fields
    }

    /// The field called `name`, with its position.
    pub fn field(&self, name: &str) -> Option<(usize, &Field)> {
        self.fields.iter().enumerate().find(|(_, f)| f.name == name)
    }

    /// Bytes of all fields of one sample.
    pub fn sample_bytes(&self) -> usize {
        self.fields.iter().map(Field::bytes).sum()
    }

    /// `(height, width)` when the feed has an `image: u8[H, W, 3]` field: what
    /// `batch.images` shows.
    pub fn image_size(&self) -> Option<(u32, u32)> {
        let (_, f) = self.field(IMAGE)?;
        match (f.dtype, f.shape.as_slice()) {
            (DType::U8, &[h, w, 3]) => Some((u32::try_from(h).ok()?, u32::try_from(w).ok()?)),
            _ => None,
        }
    }

    /// The position of the `label: i64` scalar field, when the feed has one: what
    /// `batch.labels` shows, and what a bad sample sets to −1.
    pub fn label_field(&self) -> Option<usize> {
        let (k, f) = self.field(LABEL)?;
        (f.dtype == DType::I64 && f.shape.is_empty()).then_some(k)
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, field) in self.fields.iter().enumerate() {
            if k > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{field}")?;
        }
        Ok(())
    }
}

impl FromStr for Schema {
    type Err = SchemaError;

    /// Reads the text form: `name: dtype[d0, d1, ...]` (no brackets for a scalar), comma
    /// separated, e.g. `wave: f32[16000], label: i64`.
    fn from_str(s: &str) -> Result<Self, SchemaError> {
        let mut fields = Vec::new();
        let mut rest = s.trim();
        while !rest.is_empty() {
            let (name, after) = rest.split_once(':').ok_or_else(|| {
                SchemaError::Syntax(format!("expected `name: dtype` at `{rest}`"))
            })?;
            let after = after.trim_start();
            let type_end = after.find(['[', ',']).unwrap_or(after.len());
            let dtype: DType = after[..type_end].parse()?;
            let mut after = after[type_end..].trim_start();
            let mut shape = Vec::new();
            if let Some(dims) = after.strip_prefix('[') {
                let close = dims
                    .find(']')
                    .ok_or_else(|| SchemaError::Syntax(format!("no `]` in `{rest}`")))?;
                for dim in dims[..close].split(',').filter(|d| !d.trim().is_empty()) {
                    shape.push(dim.trim().parse::<u64>().map_err(|_| {
                        SchemaError::Syntax(format!("`{}` is not a dimension", dim.trim()))
                    })?);
                }
                after = dims[close + 1..].trim_start();
            }
            fields.push(Field::new(name.trim(), dtype, shape));
            rest = match after.strip_prefix(',') {
                Some(next) => next.trim_start(),
                None if after.is_empty() => after,
                None => {
                    return Err(SchemaError::Syntax(format!(
                        "expected `,` or the end at `{after}`"
                    )));
                }
            };
        }
        Self::new(fields)
    }
}

/// A schema that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SchemaError {
    /// No fields, or too many.
    #[error("a sample has 1 to {MAX_FIELDS} fields, not {0}")]
    FieldCount(usize),
    /// A name that is empty, too long or has other characters.
    #[error("field name {0:?} must be 1 to {MAX_NAME} of A-Z a-z 0-9 _ - .")]
    Name(String),
    /// Two fields of one name.
    #[error("two fields are called {0:?}")]
    Duplicate(String),
    /// A shape that cannot be laid out.
    #[error("field {field:?}: {why}")]
    Shape {
        /// The field.
        field: String,
        /// What is wrong with its shape.
        why: String,
    },
    /// An unknown dtype name.
    #[error(
        "unknown dtype {0:?}: one of u8, i8, u16, i16, i32, i64, f16, bf16, f32, f64, bool (or NumPy's names)"
    )]
    DType(String),
    /// Text that is not a schema.
    #[error("not a schema: {0}")]
    Syntax(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_form_reads_back_what_it_writes() {
        let schema: Schema = "wave: float32[16000], length: i32, label: i64, mask: bool[4, 2]"
            .parse()
            .unwrap();
        assert_eq!(
            schema.to_string(),
            "wave: f32[16000], length: i32, label: i64, mask: bool[4, 2]"
        );
        assert_eq!(schema.to_string().parse::<Schema>().unwrap(), schema);
        assert_eq!(schema.sample_bytes(), 64000 + 4 + 8 + 8);
        assert_eq!(schema.image_size(), None);
        assert_eq!(schema.label_field(), Some(2));
        let image = Schema::image(32, 24).unwrap();
        assert_eq!(image.to_string(), "image: u8[32, 24, 3], label: i64");
        assert_eq!(image.image_size(), Some((32, 24)));
    }

    #[test]
    fn bad_schemas_are_errors_that_name_the_field() {
        let err = |s: &str| s.parse::<Schema>().unwrap_err().to_string();
        assert!(err("x: f32[0]").contains("\"x\": a dimension is 0"));
        assert!(err("x: f33").contains("unknown dtype \"f33\""));
        assert!(err("x: f32, x: i64").contains("two fields are called \"x\""));
        assert!(err("bad name: u8").contains("field name"));
        assert!(err("x: u8[1,1,1,1,1,1,1,1,1]").contains("more than 8 dimensions"));
        assert!(err("x: f64[65536, 65536]").contains("more than 1 GiB"));
        assert!(err("x: u8[18446744073709551615, 2]").contains("more than 1 GiB"));
        assert!(err("").contains("1 to 32 fields, not 0"));
        assert!(err("x u8").contains("expected `name: dtype`"));
        assert!(err("x: u8[3").contains("no `]`"));
        assert!(err("x: u8[3] y: u8").contains("expected `,`"));
        let many: Vec<String> = (0..33).map(|k| format!("f{k}: u8")).collect();
        assert!(err(&many.join(",")).contains("not 33"));
    }

    #[test]
    fn a_schema_from_the_wire_is_checked_too() {
        let json = r#"{"fields":[{"name":"x","dtype":"f32","shape":[0]}]}"#;
        assert!(serde_json::from_str::<Schema>(json).is_err());
        let json = r#"{"fields":[{"name":"x","dtype":"bf16","shape":[3]}]}"#;
        let schema: Schema = serde_json::from_str(json).unwrap();
        assert_eq!(serde_json::to_string(&schema).unwrap(), json);
    }
}
