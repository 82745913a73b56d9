//! A batch's fields: typed, checked views of the `[B, ...shape]` arrays a feed's
//! [`Schema`](ladle_ring::Schema) declares, and the owned copies a batch gathered after a
//! rejoin keeps.

use ladle_ring::{DType, Field};

/// An element type a field can be viewed as: [`BatchOf::field`](crate::BatchOf::field)
/// checks it against the field's dtype. `f16`, `bf16` and `bool` fields have no Rust type
/// here: read their bytes with [`BatchOf::field_view`](crate::BatchOf::field_view).
pub trait Element: bytemuck::Pod + sealed::Sealed {
    /// The dtype a field must have to be viewed as `Self`.
    const DTYPE: DType;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($($t:ty => $d:ident),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    )*};
}

element!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, i32 => I32, i64 => I64, f32 => F32, f64 => F64);

/// Views `bytes` as elements of `T`: `None` if they are not aligned for `T` or not a whole
/// number of them (never for ring regions and owned copies, which are 8-byte aligned and
/// hold whole samples).
pub(crate) fn cast<T: Element>(bytes: &[u8]) -> Option<&[T]> {
    bytemuck::try_cast_slice(bytes).ok()
}

/// A field of a batch, untyped: its name, dtype, shape (`[B, ...]`) and bytes.
#[derive(Debug, Clone, Copy)]
pub struct FieldView<'a> {
    /// The field as the schema declares it (per sample).
    pub field: &'a Field,
    /// Samples in the batch (`B`).
    pub len: usize,
    /// `B × ` the field's bytes per sample, contiguous, in sample order.
    pub bytes: &'a [u8],
}

impl<'a> FieldView<'a> {
    /// The field's name.
    pub fn name(&self) -> &'a str {
        &self.field.name
    }

    /// Its dtype.
    pub fn dtype(&self) -> DType {
        self.field.dtype
    }

    /// The batch's shape of it: `[B, ...shape]`.
    pub fn shape(&self) -> Vec<usize> {
        std::iter::once(self.len)
            .chain(self.field.shape.iter().map(|&d| d as usize))
            .collect()
    }

    /// Its elements as `T`; `None` when `T` is not the field's dtype.
    pub fn as_slice<T: Element>(&self) -> Option<&'a [T]> {
        (T::DTYPE == self.field.dtype)
            .then(|| cast(self.bytes))
            .flatten()
    }
}

/// Bytes kept 8-byte aligned (so that any field can be viewed in place), growing by whole
/// samples.
#[derive(Debug, Default)]
pub(crate) struct AlignedBytes {
    words: Vec<u64>,
    len: usize,
}

impl AlignedBytes {
    pub(crate) fn with_capacity(bytes: usize) -> Self {
        Self {
            words: Vec::with_capacity(bytes.div_ceil(8)),
            len: 0,
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        // `len <= words.len() × 8`, kept by `extend` and `truncate`.
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    pub(crate) fn extend(&mut self, bytes: &[u8]) {
        let len = self.len + bytes.len();
        self.words.resize(len.div_ceil(8), 0);
        bytemuck::cast_slice_mut(&mut self.words)[self.len..len].copy_from_slice(bytes);
        self.len = len;
    }

    pub(crate) fn truncate(&mut self, bytes: usize) {
        self.len = self.len.min(bytes);
        self.words.truncate(self.len.div_ceil(8));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_is_typed_only_as_its_own_dtype() {
        let field = Field::new("wave", DType::F32, [3]);
        let mut owned = AlignedBytes::default();
        for v in [1.5f32, -2.0, 3.25, 4.0, 5.0, 6.0] {
            owned.extend(&v.to_ne_bytes());
        }
        let view = FieldView {
            field: &field,
            len: 2,
            bytes: owned.as_bytes(),
        };
        assert_eq!(view.shape(), vec![2, 3]);
        assert_eq!(
            view.as_slice::<f32>(),
            Some(&[1.5, -2.0, 3.25, 4.0, 5.0, 6.0][..])
        );
        assert_eq!(view.as_slice::<i32>(), None, "same size, other dtype");
        assert_eq!(view.as_slice::<u8>(), None);
        owned.truncate(12);
        assert_eq!(cast::<f32>(owned.as_bytes()), Some(&[1.5, -2.0, 3.25][..]));
        assert_eq!(cast::<f32>(&owned.as_bytes()[1..5]), None, "misaligned");
    }
}
