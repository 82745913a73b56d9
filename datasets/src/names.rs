//! File and folder names as text, losslessly: a name that is not UTF-8 (Linux allows any
//! bytes but `/` and NUL) keeps every byte, so two such names never print alike.
//!
//! The rule: every UTF-8 character stands for itself except `\`, which is written `\\`; a
//! byte that is not part of valid UTF-8 is written `\xNN` (two lower-case hex digits). So
//! `cl\xff` is the folder whose name is the bytes `c`, `l`, 0xFF, and `a\\b` is the folder
//! named `a\b`. Class names, inspect's report and its JSON use it.

use std::ffi::OsStr;
use std::fmt::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `name` as text by the module's rule.
pub fn escape(name: &OsStr) -> String {
    let mut out = String::with_capacity(name.len());
    for chunk in name.as_bytes().utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            // Writing to a String cannot fail.
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

/// `path` as text by the module's rule (its `/` separators kept).
pub fn escape_path(path: &Path) -> String {
    escape(path.as_os_str())
}

/// Serializes a path as [`escape_path`] text (serde's own refuses a path that is not UTF-8).
pub fn serialize_path<S: serde::Serializer>(path: &Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&escape_path(path))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    fn name(bytes: &[u8]) -> &OsStr {
        OsStr::from_bytes(bytes)
    }

    #[test]
    fn names_that_differ_in_any_byte_print_differently_and_utf8_ones_as_themselves() {
        assert_eq!(escape(name(b"cl\xff")), "cl\\xff");
        assert_eq!(escape(name(b"cl\xfe")), "cl\\xfe");
        assert_eq!(escape(name("chat noir é".as_bytes())), "chat noir é");
        // A literal backslash cannot be taken for an escaped byte.
        assert_eq!(escape(name(b"cl\\xff")), "cl\\\\xff");
        assert_ne!(escape(name(b"cl\\xff")), escape(name(b"cl\xff")));
        // A cut multi-byte character keeps its bytes.
        assert_eq!(escape(name(&"é".as_bytes()[..1])), "\\xc3");
    }
}
