//! Cache prefetch hints for [`super::StateBackend::prefetch`]: asking the processor to start
//! loading the memory a state value lives in, without waiting for it. A hint never reads an
//! address into the program, so a wrong one costs a wasted load and nothing else; on
//! processors other than x86_64 the hints do nothing.

use rhai::Dynamic;

/// Asks the processor to start loading the cache line at `p`.
#[inline(always)]
#[allow(unsafe_code)]
pub fn line<T>(p: *const T) {
    // SAFETY: a prefetch instruction cannot fault or change memory, whatever the address;
    // SSE is part of every x86_64 processor.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Starts loading the first line of a map's or list's heap block (its header, which every
/// access reads first); a scalar lives inside the value itself and needs nothing.
#[inline(always)]
pub fn value(v: &Dynamic) {
    if let Ok(map) = v.as_map_ref() {
        line(&raw const *map);
    } else if let Ok(list) = v.as_array_ref() {
        line(&raw const *list);
    }
}
