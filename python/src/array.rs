//! Views of a batch's arrays: `ArrayView` exports a field, or the indices, of a held batch
//! through the buffer protocol and DLPack, read-only and without a copy (see the crate docs).

use super::*;

/// Which array of a batch a view shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Part {
    /// Field `k` of the schema.
    Field(usize),
    Indices,
}

/// How an element type is named to Python: NumPy's name, the buffer protocol's format
/// character and DLPack's type.
#[derive(Debug, Clone, Copy)]
struct Elem {
    name: &'static str,
    format: &'static CStr,
    size: usize,
    dl: DLDataType,
}

impl Elem {
    fn of(dtype: DType) -> Self {
        use dlpark::ffi::DLDataTypeCode as C;
        let (format, code): (&'static CStr, C) = match dtype {
            DType::U8 => (c"B", C::UINT),
            DType::I8 => (c"b", C::INT),
            DType::U16 => (c"H", C::UINT),
            DType::I16 => (c"h", C::INT),
            DType::I32 => (c"i", C::INT),
            DType::I64 => (c"q", C::INT),
            DType::F16 => (c"e", C::FLOAT),
            // The buffer protocol has no bfloat16: it shows the bits as uint16 (DLPack, and
            // so torch, sees bfloat16).
            DType::Bf16 => (c"H", C::BFLOAT),
            DType::F32 => (c"f", C::FLOAT),
            DType::F64 => (c"d", C::FLOAT),
            DType::Bool => (c"?", C::BOOL),
        };
        Self {
            name: dtype.numpy_name(),
            format,
            size: dtype.size(),
            dl: DLDataType::scalar(code, (dtype.size() * 8) as u8),
        }
    }

    const U64: Elem = Elem {
        name: "uint64",
        format: c"Q",
        size: 8,
        dl: DLDataType::scalar(dlpark::ffi::DLDataTypeCode::UINT, 64),
    };
}

/// A read-only, zero-copy view of one array of a batch. Exported through the buffer
/// protocol and DLPack; keeps the batch's samples held while it (or anything made from it)
/// lives.
#[pyclass(name = "ArrayView", module = "ladle", frozen)]
pub(crate) struct PyArrayView {
    batch: Arc<SharedBatch>,
    part: Part,
    elem: Elem,
    /// Shape and strides in bytes, as `Py_buffer` wants them (they must outlive the buffer;
    /// the buffer holds a reference to this object).
    shape: Vec<ffi::Py_ssize_t>,
    strides: Vec<ffi::Py_ssize_t>,
}

impl PyArrayView {
    pub(crate) fn new(batch: &Arc<SharedBatch>, part: Part) -> Self {
        let (elem, per_sample) = match part {
            Part::Field(k) => {
                let field = &batch.consumer().schema().fields()[k];
                (Elem::of(field.dtype), field.shape.clone())
            }
            Part::Indices => (Elem::U64, Vec::new()),
        };
        let shape: Vec<ffi::Py_ssize_t> = std::iter::once(batch.len() as ffi::Py_ssize_t)
            .chain(per_sample.iter().map(|&d| d as ffi::Py_ssize_t))
            .collect();
        // Row-major, in bytes.
        let mut strides = vec![elem.size as ffi::Py_ssize_t; shape.len()];
        for d in (0..shape.len() - 1).rev() {
            strides[d] = strides[d + 1] * shape[d + 1];
        }
        Self {
            batch: Arc::clone(batch),
            part,
            elem,
            shape,
            strides,
        }
    }

    /// The viewed bytes: a slice of the ring this view's batch holds.
    fn bytes(&self) -> &[u8] {
        match self.part {
            Part::Field(k) => self.batch.fields().nth(k).map_or(&[], |v| v.bytes),
            Part::Indices => as_bytes(self.batch.indices()),
        }
    }

    /// A DLPack tensor of either ABI over this view's bytes, owning a reference to the batch.
    fn export<M: ManagedTensorBase>(&self) -> PyResult<Managed<M>> {
        let to_py = |e: dlpark::metadata::Error| LadleError::new_err(format!("DLPack export: {e}"));
        let item = self.elem.size as i64;
        let shape: Vec<i64> = self.shape.iter().map(|&n| n as i64).collect();
        // DLPack strides count elements, Py_buffer strides bytes.
        let strides: Vec<i64> = self.strides.iter().map(|&n| n as i64 / item).collect();
        let data = self.bytes().as_ptr().cast_mut().cast::<c_void>();
        let mut init = dlpark::metadata::Dynamic::new(shape, strides)
            .prepare_as::<M>()
            .map_err(to_py)?
            .initialize(Arc::clone(&self.batch));
        init.set_data(data)
            .set_dtype(self.elem.dl)
            .set_device(DLDevice::CPU);
        init.set_flags(DlpackFlags::READ_ONLY)
            .map_err(|e| LadleError::new_err(format!("DLPack export: {e}")))?;
        // SAFETY: `data` points at `shape`/`strides` elements of `dtype` inside the ring
        // mapping (or the batch's owned copy); the slots stay held and the memory alive while
        // the tensor's context (the batch, dropped by its deleter) lives; the memory is never
        // written by the producer while held and is mapped read-only here, as the flag says.
        Ok(unsafe { init.finish() })
    }
}

/// The bytes of a slice of plain integers.
fn as_bytes<T: Copy>(values: &[T]) -> &[u8] {
    // SAFETY: `T` is u64 here: no padding, every byte initialised; the byte slice covers
    // exactly the same memory with the same lifetime.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), size_of_val(values)) }
}

impl DlpackExporter for PyArrayView {
    fn device(&self) -> DLDevice {
        DLDevice::CPU
    }

    fn flags(&self) -> DlpackFlags {
        DlpackFlags::READ_ONLY
    }

    fn prepare_export(&self, _py: Python<'_>, _request: &ExportRequest<'_>) -> PyResult<()> {
        Ok(())
    }

    fn export_legacy(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensor>> {
        self.export()
    }

    fn export_versioned(&self, _py: Python<'_>) -> PyResult<Managed<DLManagedTensorVersioned>> {
        self.export()
    }
}

#[pymethods]
impl PyArrayView {
    /// The shape: (B, ...the field's shape), e.g. (B, H, W, 3) for images, (B,) for labels
    /// and indices.
    #[getter]
    fn shape(&self) -> Vec<usize> {
        self.shape.iter().map(|&n| n as usize).collect()
    }

    /// NumPy's name of the element type: "uint8", "float32", "bfloat16", "int64", ...
    #[getter]
    fn dtype(&self) -> &'static str {
        self.elem.name
    }

    #[getter]
    fn nbytes(&self) -> usize {
        self.bytes().len()
    }

    /// Always True: the ring is mapped read-only in consumers.
    #[getter]
    fn readonly(&self) -> bool {
        true
    }

    /// The address of the first byte (it lies in the ring's shared mapping).
    #[getter]
    fn data_ptr(&self) -> usize {
        self.bytes().as_ptr() as usize
    }

    fn __len__(&self) -> usize {
        self.shape[0] as usize
    }

    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(u32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        let request = ExportRequest::parse(stream.as_ref(), max_version, dl_device, copy)?;
        export_dlpack(self, py, request)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (1, 0) // kDLCPU, device 0
    }

    /// # Safety
    /// Called by Python with a valid `view` to fill (the buffer protocol).
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        if view.is_null() {
            return Err(PyBufferError::new_err("a NULL Py_buffer"));
        }
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err(
                "ladle batches are read-only (the ring is shared with other training \
                 processes); copy the array to modify it",
            ));
        }
        let this = slf.get();
        let bytes = this.bytes();
        let format = this.elem.format;
        // SAFETY: `view` is non-null and Python hands us its storage to fill. `obj` takes a new
        // reference to this view, which keeps the batch (hence the slots and the mapping) and
        // the `shape`/`strides` arrays alive until the buffer is released.
        unsafe {
            (*view).buf = bytes.as_ptr().cast_mut().cast::<c_void>();
            (*view).obj = slf.clone().into_any().into_ptr();
            (*view).len = bytes.len() as ffi::Py_ssize_t;
            (*view).readonly = 1;
            (*view).itemsize = this.elem.size as ffi::Py_ssize_t;
            (*view).format = if flags & ffi::PyBUF_FORMAT == ffi::PyBUF_FORMAT {
                format.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).ndim = this.shape.len() as c_int;
            (*view).shape = if flags & ffi::PyBUF_ND == ffi::PyBUF_ND {
                this.shape.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).strides = if flags & ffi::PyBUF_STRIDES == ffi::PyBUF_STRIDES {
                this.strides.as_ptr().cast_mut()
            } else {
                std::ptr::null_mut()
            };
            (*view).suboffsets = std::ptr::null_mut();
            (*view).internal = std::ptr::null_mut();
        }
        Ok(())
    }

    /// # Safety
    /// Called by Python when a buffer from `__getbuffer__` is released.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        // Nothing to free: `obj`'s reference is dropped by Python.
    }

    fn __repr__(&self) -> String {
        format!(
            "ladle.ArrayView(shape={:?}, dtype={}, readonly=True)",
            self.shape(),
            self.dtype()
        )
    }
}
