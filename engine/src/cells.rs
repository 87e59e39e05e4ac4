//! Which KV cells are in use.
//!
//! On the unified cache, copying a prefix from one sequence to another
//! (`llama_memory_seq_cp`) does not duplicate cells: it adds the second
//! sequence to the cells the first one holds. So the cells in use are fewer
//! than the sum of the sequences' lengths, and a cell becomes free only when
//! the last sequence holding it lets go, exactly as in llama.cpp. The ledger
//! mirrors that: every cell a sequence holds has a label, and each label counts
//! its holders. Admission and eviction decide by these counts, never by the
//! sum of lengths, which would refuse a ninth request that shares a long system
//! prompt with eight others although almost nothing of it is new.

/// Holder counts of the labelled cells; a slot keeps the labels of its cells
/// in position order.
#[derive(Debug, Default)]
pub struct CellLedger {
    holders: Vec<u32>,
    /// Labels whose cells are free again, for reuse.
    free: Vec<u32>,
    used: usize,
}

impl CellLedger {
    /// Cells held by at least one sequence.
    pub fn used(&self) -> usize {
        self.used
    }

    /// Appends `n` new cells, held by one sequence, to its `cells`.
    pub fn add(&mut self, cells: &mut Vec<u32>, n: usize) {
        for _ in 0..n {
            let label = match self.free.pop() {
                Some(label) => {
                    self.holders[label as usize] = 1;
                    label
                }
                None => {
                    self.holders.push(1);
                    (self.holders.len() - 1) as u32
                }
            };
            cells.push(label);
        }
        self.used += n;
    }

    /// Another sequence now also holds `cells`; returns its copy of the labels.
    pub fn share(&mut self, cells: &[u32]) -> Vec<u32> {
        for &label in cells {
            self.holders[label as usize] += 1;
        }
        cells.to_vec()
    }

    /// A sequence lets go of `cells`; returns how many of them became free.
    pub fn release(&mut self, cells: &[u32]) -> usize {
        let mut freed = 0;
        for &label in cells {
            let count = &mut self.holders[label as usize];
            *count -= 1;
            if *count == 0 {
                self.free.push(label);
                freed += 1;
            }
        }
        self.used -= freed;
        freed
    }

    /// Cells held by any of `sequences`, each cell counted once.
    pub fn union<'a>(&self, sequences: impl IntoIterator<Item = &'a [u32]>) -> usize {
        let mut seen = vec![false; self.holders.len()];
        let mut count = 0;
        for cells in sequences {
            for &label in cells {
                if !std::mem::replace(&mut seen[label as usize], true) {
                    count += 1;
                }
            }
        }
        count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    #[test]
    fn shared_cells_are_counted_once_and_freed_by_their_last_holder() {
        let mut ledger = CellLedger::default();
        let mut donor = Vec::new();
        ledger.add(&mut donor, 10);
        // A second sequence takes the first six cells and adds two of its own.
        let mut copy = ledger.share(&donor[..6]);
        ledger.add(&mut copy, 2);
        assert_eq!(ledger.used(), 12);
        assert_eq!(ledger.union([donor.as_slice(), copy.as_slice()]), 12);
        assert_eq!(ledger.union([copy.as_slice()]), 8);
        // The donor goes: only its four unshared cells are freed.
        assert_eq!(ledger.release(&donor), 4);
        assert_eq!(ledger.used(), 8);
        // Freed labels are reused, and the copy's cells are still held.
        let mut third = Vec::new();
        ledger.add(&mut third, 4);
        assert_eq!(ledger.used(), 12);
        assert_eq!(ledger.release(&copy), 8);
        assert_eq!(ledger.release(&third), 4);
        assert_eq!(ledger.used(), 0);
    }
}
