//! Positions: byte offsets (what Weir's spans and miette use) to LSP positions (0-based line
//! and UTF-16 code units, what the protocol requires by default) and back.

use lsp_types::{Position, Range};

/// The start of every line of a text, to convert offsets in O(log lines).
#[derive(Debug)]
pub struct LineIndex<'a> {
    text: &'a str,
    /// Byte offset of each line's first character; the first is 0.
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    /// Indexes `text`. Lines end at `\n` (a `\r` before it belongs to the line's end, as in
    /// YAML and the LSP).
    pub fn new(text: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(
            text.bytes()
                .enumerate()
                .filter(|(_, b)| *b == b'\n')
                .map(|(i, _)| i + 1),
        );
        Self { text, starts }
    }

    /// The LSP position of a byte offset (clamped to the text, rounded down to a character).
    pub fn position(&self, offset: usize) -> Position {
        let mut offset = offset.min(self.text.len());
        while !self.text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.starts.partition_point(|&s| s <= offset) - 1;
        let column: usize = self.text[self.starts[line]..offset]
            .chars()
            .map(char::len_utf16)
            .sum();
        Position::new(to_u32(line), to_u32(column))
    }

    /// The LSP range of a byte range.
    pub fn range(&self, span: &std::ops::Range<usize>) -> Range {
        Range::new(self.position(span.start), self.position(span.end))
    }

    /// The byte offset of an LSP position: a character past its line's end gives the line's
    /// end (before `\r\n`), a line past the text its end; a position inside a surrogate pair
    /// gives the character's start.
    pub fn offset(&self, position: Position) -> usize {
        let line = position.line as usize;
        let Some(&start) = self.starts.get(line) else {
            return self.text.len();
        };
        let end = self.starts.get(line + 1).map_or(self.text.len(), |&n| n);
        let line_text = self.text[start..end].trim_end_matches(['\n', '\r']);
        let mut units = 0usize;
        for (i, c) in line_text.char_indices() {
            let next = units + c.len_utf16();
            if next > position.character as usize {
                return start + i;
            }
            units = next;
        }
        start + line_text.len()
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_and_positions_count_utf16_units() {
        // `é` is 2 bytes and 1 unit; `😀` is 4 bytes and 2 units.
        let text = "a: é😀x\r\nb: 1\n";
        let idx = LineIndex::new(text);
        let x = text.find('x').unwrap_or_default();
        assert_eq!(idx.position(x), Position::new(0, 6));
        assert_eq!(idx.offset(Position::new(0, 6)), x);
        let b = text.find('b').unwrap_or_default();
        assert_eq!(idx.position(b), Position::new(1, 0));
        assert_eq!(idx.offset(Position::new(1, 0)), b);
        // Past the line's end: before its `\r\n`; past the text: its end.
        assert_eq!(idx.offset(Position::new(0, 99)), x + 1);
        assert_eq!(idx.offset(Position::new(9, 0)), text.len());
        // Inside the surrogate pair: the emoji's start.
        assert_eq!(
            idx.offset(Position::new(0, 5)),
            text.find('😀').unwrap_or_default()
        );
        // Offsets inside a character round down; past the end clamp.
        assert_eq!(idx.position(4), Position::new(0, 3));
        assert_eq!(idx.position(999), Position::new(2, 0));
    }
}
