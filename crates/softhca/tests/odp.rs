//! On-demand paging (`Pd::reg_mr_on_demand`, `Pd::reg_mr_implicit`): regions over memory
//! that is not all mapped, where every access to a page that is not there (or lacks the right
//! the access needs) fails as an HCA's unserved page fault: the responder's Remote Access
//! Error for a peer's Write, Read or Atomic, the requester's Local Protection Error for its
//! own gather or landing, and never a signal. The pages that are there work as in any region.

mod common;

use common::pair::*;
use common::poll_all;
use softhca::*;

const RUN: u64 = 1_000_000_000;

/// Three anonymous pages: the first mapped read-write, the second a hole, the third mapped
/// read-only. Unmapped when dropped.
struct Pages {
    base: *mut u8,
    page: usize,
}

impl Pages {
    fn new() -> Pages {
        let page = softhca::mem::odp::page_size();
        // SAFETY: a fresh private anonymous mapping; its pages are changed only below.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                3 * page,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            let base = base.cast::<u8>();
            assert_eq!(libc::munmap(base.add(page).cast(), page), 0);
            assert_eq!(libc::mprotect(base.add(2 * page).cast(), page, libc::PROT_READ), 0);
            Pages { base, page }
        }
    }

    fn addr(&self, page: usize, at: usize) -> u64 {
        self.base as u64 + (page * self.page + at) as u64
    }

    /// A byte of the first page (the only one written).
    fn byte(&self, at: usize) -> u8 {
        // SAFETY: inside the first page, mapped readable until drop.
        unsafe { self.base.add(at).read_volatile() }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the pages this mapped; the hole's munmap is a no-op.
        unsafe { libc::munmap(self.base.cast(), 3 * self.page) };
    }
}

fn all_remote() -> Access {
    Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC
}

/// The first completion on `cq` as (wr_id, status).
fn first(cq: &Cq) -> Option<(u64, WcStatus)> {
    poll_all(cq).first().map(|w| (w.wr_id, w.status))
}

/// A peer's Write into the mapped page lands; one into the hole, and one into the read-only
/// page, fails with Remote Access Error (the requester's REM_ACCESS_ERR) and writes nothing.
#[test]
fn a_write_to_a_page_that_is_not_there_is_a_remote_access_error() {
    let pages = Pages::new();
    for (page, want) in [(0, WcStatus::Success), (1, WcStatus::RemAccessErr), (2, WcStatus::RemAccessErr)] {
        let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
        // SAFETY: the mapping outlives the region; nothing runs an atomic on it.
        let mr =
            unsafe { p.b.pd.reg_mr_on_demand(pages.base, 3 * pages.page, pages.base as u64, all_remote()) }.unwrap();
        assert!(mr.is_on_demand());
        let src = p.a.pd.reg_mr(vec![0x77; 64], Access::LOCAL_WRITE).unwrap();
        p.a.qp
            .post_send(&[SendWr::rdma_write(1, &[src.sge(0..64)], pages.addr(page, 100), mr.rkey()).signaled()])
            .unwrap();
        p.run(RUN);
        assert_eq!(first(&p.a.cq), Some((1, want)), "page {page}");
    }
    assert_eq!(pages.byte(100), 0x77, "the Write to the mapped page landed");
}

/// A peer's Read of the hole, and an Atomic on it or on the read-only page, are Remote Access
/// Errors; on the mapped page both work.
#[test]
fn reads_and_atomics_fault_where_the_page_is_not_there() {
    let pages = Pages::new();
    let cases = [
        (true, 0, WcStatus::Success),
        (true, 1, WcStatus::RemAccessErr),
        (false, 0, WcStatus::Success),
        (false, 1, WcStatus::RemAccessErr),
        (false, 2, WcStatus::RemAccessErr),
    ];
    for (read, page, want) in cases {
        let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
        // SAFETY: as above; the atomics target pages nobody unmaps meanwhile.
        let mr =
            unsafe { p.b.pd.reg_mr_on_demand(pages.base, 3 * pages.page, pages.base as u64, all_remote()) }.unwrap();
        let land = p.a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        let (whole, word) = ([land.sge(0..64)], [land.sge(0..8)]);
        let wr = match read {
            true => SendWr::rdma_read(1, &whole, pages.addr(page, 64), mr.rkey()),
            false => SendWr::atomic_fetch_add(1, &word, pages.addr(page, 8), mr.rkey(), 5),
        };
        p.a.qp.post_send(&[wr.signaled()]).unwrap();
        p.run(RUN);
        assert_eq!(first(&p.a.cq), Some((1, want)), "read {read}, page {page}");
    }
}

/// The requester's own gather from the hole, and a Read response landing in the read-only
/// page, fail with Local Protection Error; nothing leaves with bytes from nowhere.
#[test]
fn the_requesters_own_faults_are_local_protection_errors() {
    let pages = Pages::new();
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    // SAFETY: as above.
    let mr =
        unsafe { p.a.pd.reg_mr_on_demand(pages.base, 3 * pages.page, pages.base as u64, Access::LOCAL_WRITE) }.unwrap();
    let land = p.b.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ).unwrap();
    let hole = mr.sge(pages.page..pages.page + 64);
    p.a.qp.post_send(&[SendWr::rdma_write(1, &[hole], land.addr(), land.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(first(&p.a.cq), Some((1, WcStatus::LocProtErr)));

    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    // SAFETY: as above.
    let mr =
        unsafe { p.a.pd.reg_mr_on_demand(pages.base, 3 * pages.page, pages.base as u64, Access::LOCAL_WRITE) }.unwrap();
    let src = p.b.pd.reg_mr(vec![0x42; 64], Access::LOCAL_WRITE | Access::REMOTE_READ).unwrap();
    let read_only = mr.sge(2 * pages.page..2 * pages.page + 64);
    p.a.qp.post_send(&[SendWr::rdma_read(2, &[read_only], src.addr(), src.rkey()).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(first(&p.a.cq), Some((2, WcStatus::LocProtErr)));
}

/// The implicit region is the whole address space under one key: a Send gathers from and a
/// receive lands in ordinary heap buffers named by their addresses, a peer's Write lands at
/// any mapped address its R_Key names, and address 0 or a hole is a fault.
#[test]
fn the_implicit_region_reaches_any_mapped_address() {
    let pages = Pages::new();
    let mut p = Pair::new(QpType::Rc, Mtu::Mtu1024);
    // SAFETY: nothing runs an atomic through these regions; the buffers outlive the run.
    let (ia, ib) = unsafe { (p.a.pd.reg_mr_implicit(Access::LOCAL_WRITE), p.b.pd.reg_mr_implicit(all_remote())) };
    let (ia, ib) = (ia.unwrap(), ib.unwrap());
    assert!(ia.is_on_demand() && ib.is_on_demand());
    let msg = vec![0x3cu8; 3000];
    let got = vec![0u8; 3000];
    let sge = |key: u32, b: &[u8]| Sge { addr: b.as_ptr() as u64, length: b.len() as u32, lkey: key };
    p.b.qp.post_recv(&[RecvWr::new(7, &[sge(ib.lkey(), &got)])]).unwrap();
    p.a.qp.post_send(&[SendWr::send(1, &[sge(ia.lkey(), &msg)]).signaled()]).unwrap();
    p.run(RUN);
    assert_eq!(first(&p.a.cq), Some((1, WcStatus::Success)));
    assert_eq!(first(&p.b.cq), Some((7, WcStatus::Success)));
    // The receive completed: no access to `got` remains.
    assert_eq!(std::hint::black_box(&got), &msg);

    p.a.qp
        .post_send(&[SendWr::rdma_write(2, &[sge(ia.lkey(), &msg[..8])], pages.addr(0, 16), ib.rkey()).signaled()])
        .unwrap();
    p.run(RUN);
    assert_eq!(first(&p.a.cq), Some((2, WcStatus::Success)));
    assert_eq!(pages.byte(16), 0x3c);

    let mut p2 = Pair::new(QpType::Rc, Mtu::Mtu1024);
    // SAFETY: as above.
    let (ia, ib) = unsafe { (p2.a.pd.reg_mr_implicit(Access::LOCAL_WRITE), p2.b.pd.reg_mr_implicit(all_remote())) };
    let (ia, ib) = (ia.unwrap(), ib.unwrap());
    let head = [sge(ia.lkey(), &msg[..8])];
    p2.a.qp.post_send(&[SendWr::rdma_write(3, &head, pages.addr(1, 0), ib.rkey()).signaled()]).unwrap();
    p2.run(RUN);
    assert_eq!(first(&p2.a.cq), Some((3, WcStatus::RemAccessErr)), "the hole");
    drop(p);
}
