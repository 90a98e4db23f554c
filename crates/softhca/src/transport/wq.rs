//! Work queues. A QP's SQ and RQ are [`Ring`]s between the posting application (the
//! producer) and the transport engine (the consumer), as in rxe (DESIGN.md, "Lessons from
//! rxe"): a post fills free slots and publishes them with one store of the producer index, the
//! engine retires WQEs with one store of the consumer index, and neither side waits for a lock
//! the other holds while it works. An SRQ's WQEs are a ring too. Slots are reused in place, so
//! a warmed-up queue never allocates.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The shared part of a ring. WR number `n` (counted from 0 since creation) lives in slot
/// `n mod slots`, where the slots are the capacity rounded up to a power of two (an index is
/// then a mask, not a division: under emulation a division is a helper call, and a message
/// takes several slots at each end); the counters are 64-bit so that they never wrap in
/// practice, and the capacity stays exactly what the consumer asked for.
///
/// Who touches what:
/// - slots of WRs in `[cons, prod)` belong to the one [`Consumer`];
/// - slots of WRs in `[prod, cons + capacity)` belong to the [`Producer`] holding `producer`;
/// - the slot array itself is replaced only by [`Consumer::resize`], which holds both.
pub(crate) struct Ring<T> {
    slots: UnsafeCell<Slots<T>>,
    /// WRs published. Only a `Producer` stores it.
    prod: AtomicU64,
    /// WQEs retired. Only the `Consumer` stores it.
    cons: AtomicU64,
    /// Serializes producers. The consumer takes it only to rework both ends (resize), and then
    /// after its owner's lock, never the other way round.
    producer: Mutex<()>,
}

// SAFETY: a slot is handed out (as `&T` or `&mut T`) only by the side that owns its WR number
// under the rules above: the producer writes free slots and publishes them with a SeqCst (hence
// Release) store of `prod`, which the consumer loads (SeqCst, hence Acquire) before touching
// them; the consumer retires slots with a Release store of `cons`, which the producer loads with
// Acquire before reusing them. So no slot is ever accessed from two threads without a
// happens-before edge between the accesses. Values move between threads (T: Send), and a
// shared `&Consumer` may hand out `&T` on several threads at once (T: Sync).
unsafe impl<T: Send + Sync> Sync for Ring<T> {}

/// A ring's slots and its capacity, replaced together (only by [`Consumer::resize`]).
struct Slots<T> {
    /// A power of two of them, at least `capacity`.
    cells: Box<[UnsafeCell<T>]>,
    capacity: usize,
}

impl<T: Default> Slots<T> {
    /// Slots for `capacity` WRs, each readied by `prepare`.
    fn new(capacity: usize, mut prepare: impl FnMut(&mut T)) -> Slots<T> {
        let cells = (0..capacity.max(1).next_power_of_two())
            .map(|_| {
                let mut t = T::default();
                prepare(&mut t);
                UnsafeCell::new(t)
            })
            .collect();
        Slots { cells, capacity }
    }
}

impl<T> Slots<T> {
    /// Where WR number `n` lives.
    fn index(&self, n: u64) -> usize {
        n as usize & (self.cells.len() - 1)
    }

    /// The slot of WR number `n`.
    fn at(&self, n: u64) -> &UnsafeCell<T> {
        &self.cells[self.index(n)]
    }
}

impl<T> Ring<T> {
    /// A ring for `capacity` WRs whose slots (a power of two of them: up to twice the capacity)
    /// `prepare` has readied (e.g. reserved their SGE lists), so that the first use of a slot
    /// does not allocate either, and its one consumer.
    pub fn with_slots(capacity: usize, prepare: impl FnMut(&mut T)) -> (Arc<Ring<T>>, Consumer<T>)
    where
        T: Default,
    {
        let ring = Arc::new(Ring {
            slots: UnsafeCell::new(Slots::new(capacity, prepare)),
            prod: AtomicU64::new(0),
            cons: AtomicU64::new(0),
            producer: Mutex::new(()),
        });
        (ring.clone(), Consumer { ring })
    }

    /// The producer side, for posting: waits only for other producers (and for a resize).
    pub fn producer(&self) -> Producer<'_, T> {
        Producer { ring: self, _lock: self.producer.lock().unwrap_or_else(|e| e.into_inner()), staged: 0 }
    }
}

/// The posting side of a ring, while its lock is held. Slots filled with
/// [`Producer::next_slot`] and [`Producer::commit`] become visible to the consumer all at once,
/// at [`Producer::publish`].
pub(crate) struct Producer<'a, T> {
    ring: &'a Ring<T>,
    _lock: MutexGuard<'a, ()>,
    /// Slots committed since the last publish.
    staged: u64,
}

impl<T> Producer<'_, T> {
    fn slots(&self) -> &Slots<T> {
        // SAFETY: the slots are replaced only by `Consumer::resize`, which holds the producer
        // lock, and we hold it.
        unsafe { &*self.ring.slots.get() }
    }

    /// The next WR number to fill.
    fn next(&self) -> u64 {
        // Relaxed: only producers store `prod`, and they hold the lock we hold.
        self.ring.prod.load(Ordering::Relaxed) + self.staged
    }

    /// Slots free to fill: never fewer than a moment ago, as the consumer only retires.
    pub fn free(&self) -> usize {
        let cons = self.ring.cons.load(Ordering::Acquire);
        self.slots().capacity - (self.next() - cons) as usize
    }

    /// The slot behind the last one committed, to be filled and then committed. `None` when
    /// the ring is full.
    pub fn next_slot(&mut self) -> Option<&mut T> {
        if self.free() == 0 {
            return None;
        }
        let slot = self.slots().at(self.next());
        // SAFETY: WR number `next` is in [prod, cons + capacity) (free > 0, and the Acquire
        // load of `cons` in `free` ordered the consumer's last use of this slot before us), so
        // the slot is ours alone while we hold the lock; `&mut self` keeps this the only
        // reference we hand out.
        Some(unsafe { &mut *slot.get() })
    }

    pub fn commit(&mut self) {
        debug_assert!(self.free() > 0);
        self.staged += 1;
    }

    /// Makes every committed slot visible to the consumer. SeqCst rather than Release: a QP's
    /// poster loads the QP state after this store while the engine stores the state before it
    /// loads `prod`, and one of the two must see the other (`verbs::qp`, "posting").
    pub fn publish(&mut self) {
        self.ring.prod.store(self.next(), Ordering::SeqCst);
        self.staged = 0;
    }
}

/// The engine's side of a ring: the only one, kept under its owner's lock (a QP's core).
pub(crate) struct Consumer<T> {
    ring: Arc<Ring<T>>,
}

impl<T> Consumer<T> {
    fn slots(&self) -> &Slots<T> {
        // SAFETY: the slots are replaced only by `resize`, which takes `&mut self`; no `&self`
        // borrow (and so no reference from here) can be alive then.
        unsafe { &*self.ring.slots.get() }
    }

    fn cons(&self) -> u64 {
        // Relaxed: only this consumer stores `cons`.
        self.ring.cons.load(Ordering::Relaxed)
    }

    fn prod(&self) -> u64 {
        // SeqCst: when the engine flushes a QP, this load follows its SeqCst store of the QP
        // state, against the poster's SeqCst publish and load of the state (`verbs::qp`).
        self.ring.prod.load(Ordering::SeqCst)
    }

    pub fn capacity(&self) -> usize {
        self.slots().capacity
    }

    /// WQEs published and not retired. It may grow between two calls as posts arrive.
    pub fn len(&self) -> usize {
        (self.prod() - self.cons()) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th oldest WQE.
    pub fn get(&self, i: usize) -> Option<&T> {
        if i >= self.len() {
            return None;
        }
        let slot = self.slots().at(self.cons() + i as u64);
        // SAFETY: WR number cons + i is in [cons, prod), published (the SeqCst load of `prod`
        // in `len` synchronized with the producer's store), so only we access the slot until
        // we retire it, which takes `&mut self`.
        Some(unsafe { &*slot.get() })
    }

    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        if i >= self.len() {
            return None;
        }
        let slot = self.slots().at(self.cons() + i as u64);
        // SAFETY: as in `get`; `&mut self` makes this the only reference into the slot.
        Some(unsafe { &mut *slot.get() })
    }

    /// Retires the oldest WQE: from here on its slot is the producer's, so read what you need
    /// from `get(0)` first.
    pub fn pop(&mut self) {
        if !self.is_empty() {
            self.ring.cons.store(self.cons() + 1, Ordering::Release);
        }
    }

    /// Retires every published WQE without reading it (Reset, Destroy, an error without
    /// flush).
    pub fn discard(&mut self) {
        self.ring.cons.store(self.prod(), Ordering::Release);
    }

    /// Changes the capacity, keeping the queued WQEs in order; `producer` is this ring's own,
    /// so that nobody fills a slot meanwhile. `prepare` readies the new slots as at creation,
    /// so that posting after a resize does not allocate either. The caller has checked that the
    /// queued WQEs fit (MOD-GEN-10).
    pub fn resize(&mut self, producer: &mut Producer<'_, T>, capacity: usize, prepare: impl FnMut(&mut T))
    where
        T: Default,
    {
        // Like a Condvar with a second mutex: another ring's lock would leave this one open.
        assert!(std::ptr::eq(producer.ring, &*self.ring), "resize with another ring's producer");
        debug_assert!(capacity >= self.len() && producer.staged == 0);
        let (cons, prod) = (self.cons(), self.prod());
        let mut fresh = Slots::new(capacity, prepare);
        // SAFETY: we are the consumer (`&mut self`) and hold the producer lock (`producer` is
        // this ring's, checked above): nobody else can reach the slots or the box now.
        let old = unsafe { &mut *self.ring.slots.get() };
        for n in cons..prod {
            let (to, from) = (fresh.index(n), old.index(n));
            std::mem::swap(fresh.cells[to].get_mut(), old.cells[from].get_mut());
        }
        *old = fresh;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ring's indices keep counting across wraps and resizes; WQEs stay in post order.
    #[test]
    fn ring_keeps_fifo_order_across_wrap_and_resize() {
        let (ring, mut c) = Ring::<u32>::with_slots(3, |_| {});
        assert_eq!(c.capacity(), 3, "the capacity asked for, not the power of two behind it");
        for round in 0..5u32 {
            let mut p = ring.producer();
            for k in 0..3 {
                *p.next_slot().unwrap() = round * 10 + k;
                p.commit();
            }
            assert!(p.next_slot().is_none());
            assert_eq!(c.len(), 0, "nothing is visible before publish");
            p.publish();
            assert_eq!(c.get(0).copied(), Some(round * 10));
            c.pop();
            assert_eq!(p.free(), 1);
            *p.next_slot().unwrap() = round * 10 + 3;
            p.commit();
            p.publish();
            c.resize(&mut p, 5, |_| {});
            assert_eq!((c.capacity(), p.free()), (5, 2));
            let got: Vec<u32> = (0..c.len()).map(|i| *c.get(i).unwrap()).collect();
            assert_eq!(got, vec![round * 10 + 1, round * 10 + 2, round * 10 + 3]);
            *c.get_mut(2).unwrap() += 100;
            c.pop();
            c.resize(&mut p, 2, |_| {});
            let got: Vec<u32> = (0..c.len()).map(|i| *c.get(i).unwrap()).collect();
            assert_eq!(got, vec![round * 10 + 2, round * 10 + 103]);
            c.discard();
            assert!(c.is_empty());
            c.resize(&mut p, 3, |_| {});
        }
    }

    /// One producer thread and one consumer thread: every value arrives once, in order.
    #[test]
    fn ring_across_threads() {
        const N: u64 = 100_000;
        let (ring, mut c) = Ring::<u64>::with_slots(7, |_| {});
        let producer = std::thread::spawn(move || {
            let mut n = 0;
            while n < N {
                let mut p = ring.producer();
                while n < N && p.next_slot().is_some() {
                    *p.next_slot().unwrap() = n;
                    p.commit();
                    n += 1;
                }
                p.publish();
            }
        });
        let mut next = 0;
        while next < N {
            if let Some(&v) = c.get(0) {
                assert_eq!(v, next);
                c.pop();
                next += 1;
            } else {
                std::thread::yield_now();
            }
        }
        producer.join().unwrap();
    }
}
