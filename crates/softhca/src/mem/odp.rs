//! On-demand paging (`IBV_ACCESS_ON_DEMAND`): a region whose memory need not be mapped when
//! it is registered, nor stay mapped, and whose every access finds out then whether it is.
//! An HCA takes a page fault and fails the access where the page is not there; here the
//! kernel copies for the engine (`process_vm_readv`/`process_vm_writev` on the process
//! itself), which fails with EFAULT, page by page, where a page is not mapped or lacks the
//! right: an access error, never a signal, whatever a peer names inside the region. An
//! implicit region (`ibv_reg_mr(pd, NULL, SIZE_MAX, …)`) is the whole address space.
//!
//! Atomics are the one access the engine makes in place (they must be atomic against the
//! program too): the word is looked up in the process's mappings first ([`mapped`]), slowly,
//! and an atomic on a word the program unmaps at that moment would still fault.

use super::AccessError;

/// Whether this kernel lets the process copy its own memory through `process_vm_readv`
/// (Linux 3.2; a seccomp profile may forbid it): what reporting on-demand paging needs.
pub fn supported() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        let probe = 0x5au8;
        let mut back = [0u8];
        read(&raw const probe as usize, &mut back).is_ok() && back[0] == probe
    })
}

/// The calling thread's id, as the process whose memory is copied: any thread of a process
/// names its memory, and the caller's is alive (the process id names the main thread, which
/// may have exited while others run on: then the kernel finds no memory behind it).
fn me() -> libc::pid_t {
    // SAFETY: gettid cannot fail.
    unsafe { libc::gettid() }
}

/// The most one call copies: Linux caps a call's total at `MAX_RW_COUNT` (2 GiB less a page)
/// and copies less than asked beyond it.
const CALL_MAX: usize = 1 << 30;

/// Copies `len` bytes between `local` (this process's buffer) and address `remote` of this
/// process, out of it if `!to_remote`, into it if `to_remote`: every byte, in calls of at most
/// [`CALL_MAX`], each going on where the last stopped; a page fault if a page is missing or
/// lacks the right (the kernel copies up to the faulting page, then fails).
///
/// # Safety
/// `local` is valid for `len` bytes of reads, and of writes if `!to_remote`. `remote` may be
/// anything: the kernel checks it, writing only pages mapped writable (it does not force, as
/// /proc/self/mem would).
unsafe fn copy(local: *mut u8, remote: usize, len: usize, to_remote: bool) -> Result<(), AccessError> {
    let mut done = 0;
    while done < len {
        let n = (len - done).min(CALL_MAX);
        let l = libc::iovec { iov_base: local.wrapping_add(done).cast(), iov_len: n };
        let r = libc::iovec { iov_base: remote.wrapping_add(done) as *mut libc::c_void, iov_len: n };
        // SAFETY: one local iovec inside what the caller vouches for; the kernel checks the
        // remote one.
        let got = unsafe {
            match to_remote {
                true => libc::process_vm_writev(me(), &l, 1, &r, 1, 0),
                false => libc::process_vm_readv(me(), &l, 1, &r, 1, 0),
            }
        };
        match usize::try_from(got) {
            Ok(got) if got > 0 => done += got,
            _ => return Err(AccessError::PageFault),
        }
    }
    Ok(())
}

/// Copies `src` to address `to` of this process, every byte or an error (some may have
/// landed: as a faulting DMA, the access fails). The last byte goes alone, after all the
/// others, as pinned memory's tail (`copy_in`): a program that polls its buffer's last byte
/// for a Write's arrival sees it last, and its own store there is not overwritten.
pub(crate) fn write(to: usize, src: &[u8]) -> Result<(), AccessError> {
    let Some(body) = src.len().checked_sub(1) else { return Ok(()) };
    let local = src.as_ptr().cast_mut();
    // SAFETY: the local side is `src`, only read (`to_remote`).
    unsafe {
        copy(local, to, body, true)?;
        copy(local.wrapping_add(body), to.wrapping_add(body), 1, true)
    }
}

/// Copies `dst.len()` bytes at address `from` of this process into `dst`.
pub(crate) fn read(from: usize, dst: &mut [u8]) -> Result<(), AccessError> {
    // SAFETY: `dst` is a writable slice of that length.
    unsafe { copy(dst.as_mut_ptr(), from, dst.len(), false) }
}

/// Whether every page of `[addr, addr + len)` can be read now: one byte of each copied out,
/// 64 pages a system call. What the engine asks before it builds a packet from on-demand
/// memory that it could not take back (a Read response, which a fault turns into a NAK).
pub(crate) fn readable(addr: usize, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let Some(last) = addr.checked_add(len - 1) else { return false };
    let page = page_size();
    let (first_page, last_page) = (addr / page, last / page);
    let mut scratch = [0u8; 64];
    let mut remote = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 1 }; 64];
    let mut p = first_page;
    while p <= last_page {
        let n = (last_page - p + 1).min(remote.len());
        for (i, r) in remote[..n].iter_mut().enumerate() {
            // The range's first byte, then each later page's first (no product overflows:
            // the last page's start is at most `last`).
            r.iov_base = if p + i == first_page { addr } else { (p + i) * page } as *mut libc::c_void;
        }
        let local = libc::iovec { iov_base: scratch.as_mut_ptr().cast(), iov_len: n };
        // SAFETY: `scratch` takes the `n` bytes asked for; the kernel checks the remote ones.
        let got = unsafe { libc::process_vm_readv(me(), &local, 1, remote.as_ptr(), n as u64, 0) };
        if got != n as isize {
            return false;
        }
        p += n;
    }
    true
}

/// Faults in `[addr, addr + len)` for reading, or for writing if `write` (`ibv_advise_mr`'s
/// prefetch: Linux's MADV_POPULATE_READ/WRITE, 5.14; before, a probe of each page); false if a
/// page is not mapped so.
pub(crate) fn populate(addr: usize, len: usize, write: bool) -> bool {
    const MADV_POPULATE_READ: libc::c_int = 22;
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    if len == 0 {
        return true;
    }
    let Some(end) = addr.checked_add(len) else { return false };
    let page = page_size();
    let start = addr - addr % page;
    let advice = if write { MADV_POPULATE_WRITE } else { MADV_POPULATE_READ };
    // SAFETY: populating changes no contents; the kernel checks the range.
    let r = unsafe { libc::madvise(start as *mut libc::c_void, end - start, advice) };
    if r == 0 {
        return true;
    }
    // SAFETY: errno of this thread, just set.
    let old_kernel = unsafe { *libc::__errno_location() } == libc::EINVAL;
    old_kernel && readable(addr, len) && (!write || mapped(addr, len, true))
}

/// Whether every page of `[addr, addr + len)` is mapped readable, and writable if `write`,
/// from `/proc/self/maps` (whose mappings come in address order): what the kernel's pin of a
/// user region demands of it, and what an atomic on an on-demand region checks first. Slow
/// (a file read): registrations and atomics on on-demand memory only.
pub fn mapped(addr: usize, len: usize, write: bool) -> bool {
    maps_say(addr, len, write).unwrap_or(true)
}

/// Whether an atomic may run in place on `[addr, addr + len)` now: the pages faulted in for
/// writing (MADV_POPULATE_WRITE, which fails where the access would fault or raise SIGBUS, and
/// on I/O mappings), or where the kernel lacks it (before 5.14) the mappings say so. Fails
/// closed. A page the program unmaps between this and the atomic still faults (the README's
/// difference).
pub(crate) fn writable_now(addr: usize, len: usize) -> bool {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    static POPULATES: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let populates = *POPULATES.get_or_init(|| {
        let page = vec![0u8; 2 * page_size()];
        let at = page.as_ptr() as usize;
        let start = at - at % page_size() + page_size();
        // SAFETY: a page inside a live heap buffer; populating changes no contents.
        unsafe { libc::madvise(start as *mut libc::c_void, page_size(), MADV_POPULATE_WRITE) == 0 }
    });
    let Some(end) = addr.checked_add(len) else { return false };
    if !populates {
        return maps_say(addr, len, true) == Some(true);
    }
    let start = addr - addr % page_size();
    // SAFETY: populating changes no contents; the kernel checks the range.
    unsafe { libc::madvise(start as *mut libc::c_void, end - start, MADV_POPULATE_WRITE) == 0 }
}

/// What `/proc/self/maps` says of the range (see [`mapped`]); None if it cannot be read.
fn maps_say(addr: usize, len: usize, write: bool) -> Option<bool> {
    if len == 0 {
        return Some(true);
    }
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let page = page_size();
    let (mut at, end) = (addr - addr % page, addr.saturating_add(len));
    for line in maps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        let Some((start, stop)) = range.split_once('-') else { continue };
        let (Ok(start), Ok(stop)) = (usize::from_str_radix(start, 16), usize::from_str_radix(stop, 16)) else {
            continue;
        };
        if stop <= at {
            continue;
        }
        let perms = perms.as_bytes();
        if start > at || perms.first() != Some(&b'r') || (write && perms.get(1) != Some(&b'w')) {
            return Some(false); // a hole, or a page without the rights
        }
        at = stop;
        if at >= end {
            return Some(true);
        }
    }
    Some(false)
}

/// The system's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Copies to and from mapped memory land; a hole and a read-only page fail with a page
    /// fault instead of a signal, and leave the read-only page as it was.
    #[test]
    fn a_missing_or_read_only_page_is_a_fault_not_a_signal() {
        assert!(supported());
        let page = page_size();
        // SAFETY: a fresh anonymous mapping of three pages, unmapped below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let base = base as usize;
        // The middle page goes (a hole), the last becomes read-only.
        // SAFETY: pages of the mapping above.
        unsafe {
            assert_eq!(libc::munmap((base + page) as *mut libc::c_void, page), 0);
            assert_eq!(libc::mprotect((base + 2 * page) as *mut libc::c_void, page, libc::PROT_READ), 0);
        }
        write(base + 10, b"landed").unwrap();
        let mut back = [0u8; 6];
        read(base + 10, &mut back).unwrap();
        assert_eq!(&back, b"landed");
        assert_eq!(write(base + page + 1, b"x"), Err(AccessError::PageFault), "a hole");
        assert_eq!(read(base + page + 1, &mut back), Err(AccessError::PageFault), "a hole");
        assert_eq!(write(base + page - 2, b"xyz"), Err(AccessError::PageFault), "across into a hole");
        assert_eq!(write(base + page - 3, b"abcd"), Err(AccessError::PageFault), "the last byte in a hole");
        read(base + page - 3, &mut back[..3]).unwrap();
        assert_eq!(&back[..3], b"abc", "the body lands before the last byte");
        assert_eq!(read(base + page - 3, &mut back[..4]), Err(AccessError::PageFault), "a read across");
        // From another thread: the copies name the process by the calling thread.
        let (b, p) = (base, page);
        std::thread::spawn(move || write(b + 20, b"thread").and(read(b + p + 20, &mut [0u8; 2])))
            .join()
            .unwrap()
            .expect_err("a hole from another thread");
        read(base + 20, &mut back).unwrap();
        assert_eq!(&back, b"thread");
        assert_eq!(write(base + 2 * page, b"x"), Err(AccessError::PageFault), "a read-only page");
        read(base + 2 * page, &mut back).unwrap();
        assert_eq!(back, [0; 6], "the read-only page as it was");
        assert!(mapped(base, 8, true) && !mapped(base + page, 8, false) && !mapped(base + 2 * page, 8, true));
        assert!(mapped(base + 2 * page, 8, false));
        assert_eq!(read(0, &mut back), Err(AccessError::PageFault), "address 0");
        assert!(readable(base, page) && readable(base + 2 * page, page) && readable(base + 5, 1));
        assert!(!readable(base + page - 1, 2) && !readable(base, 3 * page) && !readable(base + page + 7, 1));
        assert!(!readable(usize::MAX - 3, 8), "past the top");
        assert!(populate(base + 5, 100, true) && populate(base + 2 * page, 10, false));
        assert!(!populate(base + 2 * page, 10, true), "a read-only page for writing");
        assert!(!populate(base + page, 10, false), "a hole");
        assert!(writable_now(base + 8, 8) && !writable_now(base + page, 8) && !writable_now(base + 2 * page, 8));
        // SAFETY: the rest of the mapping.
        unsafe {
            libc::munmap(base as *mut libc::c_void, page);
            libc::munmap((base + 2 * page) as *mut libc::c_void, page);
        }
    }
}
