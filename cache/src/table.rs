//! Typed views of the cache's mappings: an index's words as atomics, an arena's records as
//! headers and byte slices, every access bounds-checked against the mapping (a record a
//! buggy filler wrote wrong is refused, never read past its arena).

use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicU64;

use ladle_os::shm::Mapping;

use crate::layout::{HEADER_LEN, INDEX_HEADER_LEN, IndexHeader, RecordHeader, index_file_len};

/// An index mapped read-only (a feed) or read-write (the keeper).
#[derive(Debug)]
pub(crate) struct IndexView {
    map: Mapping,
    len: u64,
}

impl IndexView {
    /// Maps the index of `len` samples in `fd`.
    pub(crate) fn map(fd: BorrowedFd<'_>, len: u64, writable: bool) -> std::io::Result<Self> {
        let bytes = index_file_len(len);
        if ladle_os::shm::file_len(fd)? != bytes {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("an index of {len} samples is {bytes} bytes; this file is not"),
            ));
        }
        let map = Mapping::new(fd, 0, bytes as usize, writable, false)?;
        Ok(Self { map, len })
    }

    /// Header word `which`.
    pub(crate) fn header(&self, which: IndexHeader) -> &AtomicU64 {
        // SAFETY: the header page is inside the mapping, word-aligned (the mapping is
        // page-aligned), and lives as long as `self`; every access to it is atomic.
        unsafe { &*self.map.as_ptr().cast::<AtomicU64>().add(which as usize) }
    }

    /// Sample `index`'s word; `None` past the end.
    pub(crate) fn word(&self, index: u64) -> Option<&AtomicU64> {
        if index >= self.len {
            return None;
        }
        let at = INDEX_HEADER_LEN as usize + index as usize * 8;
        // SAFETY: `at + 8 <= index_file_len(len)`, 8-aligned; see `header`.
        Some(unsafe { &*self.map.as_ptr().add(at).cast::<AtomicU64>() })
    }
}

/// An arena mapped read-only (readers, the keeper) or read-write (its filler).
#[derive(Debug)]
pub(crate) struct ArenaView {
    map: Mapping,
    bytes: u64,
}

impl ArenaView {
    pub(crate) fn map(fd: BorrowedFd<'_>, bytes: u64, writable: bool) -> std::io::Result<Self> {
        if ladle_os::shm::file_len(fd)? != bytes {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("the arena's file is not the {bytes} bytes granted"),
            ));
        }
        let map = Mapping::new(
            fd,
            0,
            usize::try_from(bytes).unwrap_or(usize::MAX),
            writable,
            false,
        )?;
        Ok(Self { map, bytes })
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The header of the record at `offset`, if one lies there wholly inside the arena.
    pub(crate) fn header(&self, offset: u64) -> Option<RecordHeader> {
        if offset.checked_add(HEADER_LEN as u64)? > self.bytes {
            return None;
        }
        let mut bytes = [0u8; HEADER_LEN];
        // SAFETY: `offset + HEADER_LEN <= bytes`, inside the mapping. Published records are
        // not written again (the protocol); a misbehaving filler of the same user can at
        // worst change the bytes read, never their bounds.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.map.as_ptr().add(offset as usize),
                bytes.as_mut_ptr(),
                HEADER_LEN,
            );
        }
        let header = RecordHeader::decode(&bytes)?;
        header.fits(offset, self.bytes).then_some(header)
    }

    /// The pixels of the record at `offset` whose header is `header` (from
    /// [`ArenaView::header`] at that offset).
    pub(crate) fn pixels(&self, offset: u64, header: &RecordHeader) -> &[u8] {
        let start = offset as usize + HEADER_LEN;
        let len = header.pixels_len() as usize;
        assert!(
            header.fits(offset, self.bytes),
            "a record outside its arena"
        );
        // SAFETY: inside the mapping (checked above), which lives as long as `self`; see
        // `header` for what may change under a reader.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(start), len) }
    }

    /// Writes a record at `offset` (a writable view: its filler's, before publishing it).
    pub(crate) fn write(&self, offset: u64, header: &RecordHeader, pixels: &[u8]) {
        assert!(
            header.fits(offset, self.bytes),
            "a record outside its arena"
        );
        assert_eq!(pixels.len() as u64, header.pixels_len());
        // SAFETY: inside the mapping (checked above); a writable view is its filler's alone,
        // and the record is not published yet, so nobody reads it.
        unsafe {
            let at = self.map.as_ptr().add(offset as usize);
            std::ptr::copy_nonoverlapping(header.encode().as_ptr(), at, HEADER_LEN);
            std::ptr::copy_nonoverlapping(pixels.as_ptr(), at.add(HEADER_LEN), pixels.len());
        }
    }
}
