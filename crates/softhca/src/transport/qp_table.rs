//! A device's QPs by number, the way an HCA keeps them: the QPN's low bits index a table.
//!
//! Every packet looks its QP up, and so do a transmit turn (for the QP after it, to prefetch)
//! and the link's receive prefetch. A hash table spread sequential QPNs over its buckets, so
//! with 10,000 QPs taking turns in QPN order each lookup landed on a line no recent lookup
//! had touched: a cache miss a lookup (`Engine::prefetch_dest` was 6% of the 10,000-QP run
//! on the sim link, all of it that one load). Indexed by the low bits, QPs that take turns
//! one after the other sit side by side, eight to a line, and the table (8 bytes a slot, at
//! most twice as many slots as QPs) stays in the cache.
//!
//! The device allocates QPNs whose slot is free ([`NumberTable::is_free`]), so a slot holds one
//! QP. A QP that finds its slot taken anyway (two Create QPs racing between allocation and
//! insertion) goes to a small hash table beside it, looked at only when it is not empty.
//! Lookups are bounded either way: one slot, then at most one hash probe; a peer naming a
//! QPN that does not exist costs the same.
//!
//! The table holds anything [`Numbered`] (the transport's `QpTable` is a table of `QpInner`),
//! so it imports nothing of the transport and its tests need no device.

use std::sync::Arc;

/// The fewest slots a table has: a device with a handful of QPs never grows it.
const MIN_SLOTS: usize = 64;

/// What the table keys its entries by.
pub(crate) trait Numbered {
    fn number(&self) -> u32;
}

pub(crate) struct NumberTable<T> {
    /// A power of two long; slot `qpn & (len - 1)` holds QP `qpn` (or, after a race, another
    /// QP whose number has the same low bits, and `qpn` is in `spill`).
    slots: Box<[Option<Arc<T>>]>,
    /// The QPs whose slot was taken when they were inserted.
    spill: rustc_hash::FxHashMap<u32, Arc<T>>,
    len: usize,
}

impl<T> Default for NumberTable<T> {
    fn default() -> Self {
        NumberTable { slots: empty_slots(MIN_SLOTS), spill: Default::default(), len: 0 }
    }
}

fn empty_slots<T>(n: usize) -> Box<[Option<Arc<T>>]> {
    std::iter::repeat_with(|| None).take(n).collect()
}

impl<T: Numbered> NumberTable<T> {
    fn index(&self, qpn: u32) -> usize {
        qpn as usize & (self.slots.len() - 1)
    }

    /// The QP numbered `qpn`.
    #[inline]
    pub fn get(&self, qpn: u32) -> Option<&Arc<T>> {
        match &self.slots[self.index(qpn)] {
            Some(q) if q.number() == qpn => Some(q),
            _ if self.spill.is_empty() => None,
            _ => self.spill.get(&qpn),
        }
    }

    /// The QP in `qpn`'s slot, without reading it to check its number: for a prefetch, which
    /// must not wait for the line it asks for.
    #[inline]
    pub fn slot(&self, qpn: u32) -> Option<&Arc<T>> {
        self.slots[self.index(qpn)].as_ref()
    }

    pub fn contains_key(&self, qpn: u32) -> bool {
        self.get(qpn).is_some()
    }

    /// Whether a new QP numbered `qpn` would have its slot to itself (and no QP has the number).
    pub fn is_free(&self, qpn: u32) -> bool {
        self.slots[self.index(qpn)].is_none() && !self.spill.contains_key(&qpn)
    }

    /// Adds a QP, replacing one of the same number (the caller checks there is none).
    pub fn insert(&mut self, qp: Arc<T>) {
        if self.remove(qp.number()).is_none() && (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        self.place(qp);
    }

    fn place(&mut self, qp: Arc<T>) {
        self.len += 1;
        let i = self.index(qp.number());
        if self.slots[i].is_none() {
            self.slots[i] = Some(qp);
        } else {
            self.spill.insert(qp.number(), qp);
        }
    }

    pub fn remove(&mut self, qpn: u32) -> Option<Arc<T>> {
        let i = self.index(qpn);
        let taken = if self.slots[i].as_ref().is_some_and(|q| q.number() == qpn) {
            self.slots[i].take()
        } else {
            self.spill.remove(&qpn)
        };
        if taken.is_some() {
            self.len -= 1;
        }
        taken
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<T>> {
        self.slots.iter().flatten().chain(self.spill.values())
    }

    /// Twice the slots; spilled QPs move in where the wider index separates them from the QP
    /// that had their slot.
    fn grow(&mut self) {
        let wider = empty_slots(self.slots.len() * 2);
        let old = std::mem::replace(&mut self.slots, wider);
        let spilled = std::mem::take(&mut self.spill);
        self.len = 0;
        for q in old.into_vec().into_iter().flatten().chain(spilled.into_values()) {
            self.place(q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct N(u32);

    impl Numbered for N {
        fn number(&self) -> u32 {
            self.0
        }
    }

    fn numbers(t: &NumberTable<N>) -> Vec<u32> {
        let mut v: Vec<u32> = t.values().map(|q| q.0).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn sequential_numbers_take_neighbouring_slots_and_the_table_grows_at_half_full() {
        let mut t = NumberTable::default();
        let first = 0x00AB_CDE0;
        for qpn in first..first + 1000 {
            assert!(t.is_free(qpn));
            t.insert(Arc::new(N(qpn)));
        }
        assert_eq!(t.len, 1000);
        assert_eq!(t.slots.len(), 2048, "at most twice as many slots as entries, a power of two");
        assert!(t.spill.is_empty(), "sequential numbers never share a slot");
        for qpn in first..first + 1000 {
            assert_eq!(t.get(qpn).map(|q| q.0), Some(qpn));
            assert_eq!(t.slot(qpn).map(|q| q.0), Some(qpn));
            assert!(!t.is_free(qpn));
        }
        // A number sharing the low bits of one present is absent, and not free.
        let alias = first + 2048;
        assert!(t.get(alias).is_none());
        assert!(!t.contains_key(alias));
        assert!(!t.is_free(alias), "its slot is taken");
        assert_eq!(t.slot(alias).map(|q| q.0), Some(first), "the slot is only a hint");
    }

    #[test]
    fn a_number_whose_slot_is_taken_spills_and_moves_in_when_the_table_grows() {
        let mut t = NumberTable::default();
        let n = MIN_SLOTS as u32;
        t.insert(Arc::new(N(5)));
        t.insert(Arc::new(N(5 + n)));
        t.insert(Arc::new(N(5 + 2 * n)));
        assert_eq!(t.spill.len(), 2);
        for qpn in [5, 5 + n, 5 + 2 * n] {
            assert_eq!(t.get(qpn).map(|q| q.0), Some(qpn));
        }
        assert!(t.get(5 + 3 * n).is_none());
        // The slot's QP leaves: the spilled ones are still found, and their numbers not free.
        assert_eq!(t.remove(5).map(|q| q.0), Some(5));
        assert!(t.is_free(5));
        assert!(!t.is_free(5 + n));
        assert_eq!(t.get(5 + n).map(|q| q.0), Some(5 + n));
        assert!(t.remove(5).is_none());
        // Growing to 2n slots separates 5 + n from 5 + 2n (their bit n differs).
        for qpn in 200..200 + n / 2 {
            t.insert(Arc::new(N(qpn)));
        }
        assert_eq!(t.slots.len(), 2 * MIN_SLOTS);
        assert!(t.spill.is_empty());
        assert_eq!(t.len, 2 + n as usize / 2);
        let mut want = vec![5 + n, 5 + 2 * n];
        want.extend(200..200 + n / 2);
        assert_eq!(numbers(&t), want);
    }

    #[test]
    fn inserting_a_number_again_replaces_its_entry() {
        let mut t = NumberTable::default();
        t.insert(Arc::new(N(7)));
        let again = Arc::new(N(7));
        t.insert(again.clone());
        assert_eq!(t.len, 1);
        assert!(Arc::ptr_eq(t.get(7).unwrap(), &again));
        assert_eq!(t.remove(7).map(|q| q.0), Some(7));
        assert_eq!(t.len, 0);
        assert!(t.values().next().is_none());
    }
}
