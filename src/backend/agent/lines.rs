//! Splits a child's stdout into lines, never holding more than a bound: a longer line is
//! dropped whole, and bytes that are not UTF-8 make a line unparsable, not the stream. Every
//! agent kind speaks newline-delimited JSON.

use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::{ready, Poll};

use tokio::io::{AsyncRead, ReadBuf};

/// The longest line [`Lines`] hands on (a Codex item with a large command output fits).
pub const MAX_LINE_BYTES: usize = 64 * 1024 * 1024;

/// One read of a child's output (a pipe holds 64 KiB; a longer line takes several reads).
const READ_BYTES: usize = 8 * 1024;

/// Splits a byte stream into lines (without their `\n`) of at most `max` bytes.
pub struct Lines {
    buf: Vec<u8>,
    max: usize,
    /// Inside a line that went over the bound: its rest is dropped up to the next `\n`.
    skipping: bool,
    /// Lines dropped for their length.
    pub dropped: u64,
}

impl Lines {
    pub fn new(max: usize) -> Lines {
        Lines {
            buf: Vec::new(),
            max,
            skipping: false,
            dropped: 0,
        }
    }

    /// Feeds bytes; `line` gets every line they complete, in order.
    pub fn push(&mut self, mut bytes: &[u8], mut line: impl FnMut(&[u8])) {
        while let Some(pos) = memchr::memchr(b'\n', bytes) {
            let head = &bytes[..pos];
            bytes = &bytes[pos + 1..];
            if std::mem::take(&mut self.skipping) {
                continue;
            }
            if self.buf.len() + head.len() > self.max {
                self.dropped += 1;
                self.buf.clear();
            } else if self.buf.is_empty() {
                line(head);
            } else {
                self.buf.extend_from_slice(head);
                line(&self.buf);
                self.buf.clear();
            }
        }
        if self.skipping {
            return;
        }
        if self.buf.len() + bytes.len() > self.max {
            self.dropped += 1;
            self.skipping = true;
            self.buf = Vec::new();
        } else {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// Reads once from `from` and feeds what came; `Ok(0)` at its end. The read's buffer is
    /// on the stack of the poll that fills it, so a reader holds no buffer while it waits: a
    /// retiring app-server process lives while any of its turns is held, and its share per
    /// held turn is what counts.
    pub async fn read_from<R: AsyncRead + Unpin>(
        &mut self,
        from: &mut R,
        mut line: impl FnMut(&[u8]),
    ) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| {
            let mut raw = [MaybeUninit::<u8>::uninit(); READ_BYTES];
            let mut buf = ReadBuf::uninit(&mut raw);
            ready!(Pin::new(&mut *from).poll_read(cx, &mut buf))?;
            let got = buf.filled();
            self.push(got, &mut line);
            Poll::Ready(Ok(got.len()))
        })
        .await
    }

    /// Bytes held for an unfinished line.
    pub fn pending(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]], max: usize) -> (Vec<Vec<u8>>, u64) {
        let mut lines = Lines::new(max);
        let mut out = Vec::new();
        for c in chunks {
            lines.push(c, |l| out.push(l.to_vec()));
            assert!(lines.pending() <= max);
        }
        (out, lines.dropped)
    }

    #[test]
    fn lines_are_split_across_chunks_and_bounded() {
        let (out, dropped) = split(&[b"ab", b"c\nd", b"\n\nef"], 8);
        assert_eq!(out, [b"abc".to_vec(), b"d".to_vec(), b"".to_vec()]);
        assert_eq!(dropped, 0);
        // A line over the bound is dropped whole, even when it spans chunks.
        let (out, dropped) = split(&[b"12345", b"6789", b"0\nok\n", b"123456789\nz\n"], 8);
        assert_eq!(out, [b"ok".to_vec(), b"z".to_vec()]);
        assert_eq!(dropped, 2);
    }
}
