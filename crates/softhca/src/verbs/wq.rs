//! A work queue: a fixed ring of reusable WQE slots. Posting fills the next free slot in
//! place, so a warmed-up queue never allocates.

/// A bounded FIFO of WQEs with stable, reusable slots.
#[derive(Debug)]
pub(crate) struct WorkQueue<T> {
    slots: Vec<T>,
    head: usize,
    len: usize,
}

impl<T: Default> WorkQueue<T> {
    pub fn new(capacity: usize) -> Self {
        WorkQueue { slots: (0..capacity).map(|_| T::default()).collect(), head: 0, len: 0 }
    }

    /// A queue whose slots `prepare` has readied (e.g. reserved their SGE lists), so that the
    /// first use of a slot does not allocate either.
    pub fn with_slots(capacity: usize, prepare: impl FnMut(&mut T)) -> Self {
        let mut q = Self::new(capacity);
        q.slots.iter_mut().for_each(prepare);
        q
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn free(&self) -> usize {
        self.capacity() - self.len
    }

    /// The slot behind the tail, to be filled and then committed with [`WorkQueue::commit`].
    /// `None` when the queue is full.
    pub fn next_slot(&mut self) -> Option<&mut T> {
        if self.len == self.slots.len() {
            return None;
        }
        let i = (self.head + self.len) % self.slots.len();
        Some(&mut self.slots[i])
    }

    pub fn commit(&mut self) {
        debug_assert!(self.len < self.slots.len());
        self.len += 1;
    }

    /// The `i`-th oldest WQE.
    pub fn get(&self, i: usize) -> Option<&T> {
        (i < self.len).then(|| &self.slots[(self.head + i) % self.slots.len()])
    }

    pub fn get_mut(&mut self, i: usize) -> Option<&mut T> {
        let n = self.slots.len();
        (i < self.len).then(|| &mut self.slots[(self.head + i) % n])
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Retires the oldest WQE; its slot stays allocated for reuse.
    pub fn pop(&mut self) -> Option<&T> {
        if self.len == 0 {
            return None;
        }
        let i = self.head;
        self.head = (self.head + 1) % self.slots.len();
        self.len -= 1;
        Some(&self.slots[i])
    }

    pub fn clear(&mut self) {
        self.head = 0;
        self.len = 0;
    }

    /// Changes the capacity, keeping the queued WQEs in order. The caller has checked that they
    /// fit (MOD-GEN-10).
    pub fn resize(&mut self, capacity: usize) {
        debug_assert!(capacity >= self.len);
        let mut slots: Vec<T> = (0..capacity).map(|_| T::default()).collect();
        for (i, slot) in slots.iter_mut().enumerate().take(self.len) {
            let j = (self.head + i) % self.slots.len();
            std::mem::swap(slot, &mut self.slots[j]);
        }
        self.slots = slots;
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_fifo_order_across_wrap_and_resize() {
        let mut q: WorkQueue<u32> = WorkQueue::new(3);
        for round in 0..5u32 {
            for k in 0..3 {
                *q.next_slot().unwrap() = round * 10 + k;
                q.commit();
            }
            assert!(q.next_slot().is_none());
            assert_eq!(q.pop().copied(), Some(round * 10));
            *q.next_slot().unwrap() = round * 10 + 3;
            q.commit();
            q.resize(5);
            assert_eq!(q.free(), 2);
            let got: Vec<u32> = (0..q.len()).map(|i| *q.get(i).unwrap()).collect();
            assert_eq!(got, vec![round * 10 + 1, round * 10 + 2, round * 10 + 3]);
            q.clear();
            q.resize(3);
        }
    }
}
