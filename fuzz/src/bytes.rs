//! Byte-level damage shared by every target: flipped and inserted bytes, invalid UTF-8,
//! truncation, repeated ranges, and the markers that make length fields lie.

use crate::Rng;

/// Byte sequences that are never valid UTF-8, or valid but unusual.
const ODD_BYTES: &[&[u8]] = &[
    b"\xff",
    b"\xc3",
    b"\xc0\xaf",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xef\xbb\xbf",
    b"\x00",
    b"\r",
    b"\r\n",
    b"\t",
    b"\xe2\x80\xae",
    b"\xf0\x9f\x98\x80",
];

/// Applies 1 to 4 random byte-level edits to `data`.
pub fn mutate(rng: &mut Rng, data: &mut Vec<u8>, tokens: &[&[u8]]) {
    for _ in 0..rng.between(1, 4) {
        let at = rng.below(data.len() + 1);
        match rng.below(9) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = rng.next_u64() as u8;
            }
            2 => {
                let odd = rng.pick(ODD_BYTES);
                data.splice(at..at, odd.iter().copied());
            }
            3 => data.truncate(at),
            4 if !data.is_empty() => {
                // Repeat a range, sometimes many times.
                let start = rng.below(data.len());
                let end = (start + rng.between(1, 64)).min(data.len());
                let piece = data[start..end].to_vec();
                let times = if rng.chance(10) {
                    rng.between(2, 2000)
                } else {
                    1
                };
                for _ in 0..times {
                    data.splice(at..at, piece.iter().copied());
                }
            }
            5 if !data.is_empty() => {
                let end = (at + rng.between(1, 32)).min(data.len());
                if at < end {
                    data.drain(at..end);
                }
            }
            6 if !tokens.is_empty() => {
                let token = rng.pick(tokens);
                data.splice(at..at, token.iter().copied());
            }
            7 => {
                let n = rng.between(1, 16);
                let noise: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
                data.splice(at..at, noise);
            }
            _ => {
                // Overwrite with a "length" that claims the maximum.
                let lie = *rng.pick(&[
                    &[0xdd, 0xff, 0xff, 0xff, 0xff][..],
                    &[0xdf, 0xff, 0xff, 0xff, 0xff][..],
                    &[0xdb, 0x7f, 0xff, 0xff, 0xff][..],
                    &[0xc6, 0xff, 0xff, 0xff, 0xff][..],
                    &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff][..],
                ]);
                let end = (at + lie.len()).min(data.len());
                data.splice(at..end, lie.iter().copied());
            }
        }
    }
}

/// Random bytes of length `0..=max`, drawn from `tokens` and from raw noise.
pub fn random(rng: &mut Rng, max: usize, tokens: &[&[u8]]) -> Vec<u8> {
    let len = rng.small(max);
    let mut out = Vec::with_capacity(len + 16);
    while out.len() < len {
        if !tokens.is_empty() && rng.chance(70) {
            let token: &[u8] = tokens[rng.below(tokens.len())];
            out.extend_from_slice(token);
        } else {
            out.push(rng.next_u64() as u8);
        }
    }
    out
}
