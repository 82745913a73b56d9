//! A group's saved state: the positions of all its ranks, and what their epoch had still to
//! deliver, for a group resumed with another world size
//! ([`crate::Consumer::load_group_positions`]). Pure.

use crate::plan::{Bitmap, GroupSpec, PlanError, try_zeroed};

use super::SavedPosition;

/// The saved state of a whole group: the epoch its positions are of and its group (the
/// rank is the first position's, meaningless here). Refused, in words, unless every
/// position is of one group (name, world size, evening) and one epoch, and every rank
/// `0..W` is there exactly once.
pub fn group_state(positions: &[SavedPosition]) -> Result<(u64, GroupSpec), String> {
    let Some(first) = positions.first() else {
        return Err("is empty: no rank's position".into());
    };
    let Some(group) = &first.group else {
        return Err("holds the position of a consumer of whole epochs, not of a rank".into());
    };
    let mut seen = vec![0u32; group.world_size as usize];
    for p in positions {
        let Some(g) = &p.group else {
            return Err("mixes ranks with a consumer of whole epochs".into());
        };
        if (&g.name, g.world_size, g.even) != (&group.name, group.world_size, group.even) {
            return Err(format!(
                "mixes groups: {:?} of {} (even={}) and {:?} of {} (even={})",
                group.name, group.world_size, group.even, g.name, g.world_size, g.even
            ));
        }
        if p.epoch != first.epoch {
            return Err(format!(
                "mixes epochs {} and {}: save every rank's position at the same step",
                first.epoch, p.epoch
            ));
        }
        if let Some(count) = seen.get_mut(g.rank as usize) {
            *count += 1;
        }
    }
    let missing: Vec<String> = (0..group.world_size)
        .filter(|&r| seen[r as usize] == 0)
        .map(|r| r.to_string())
        .collect();
    let twice: Vec<String> = (0..group.world_size)
        .filter(|&r| seen[r as usize] > 1)
        .map(|r| r.to_string())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "lacks rank{} {} of {}: save every rank's position (rank 0 gathers them)",
            if missing.len() == 1 { "" } else { "s" },
            missing.join(", "),
            group.world_size
        ));
    }
    if !twice.is_empty() {
        return Err(format!(
            "holds rank{} {} twice",
            if twice.len() == 1 { "" } else { "s" },
            twice.join(", ")
        ));
    }
    Ok((first.epoch, group.clone()))
}

/// What a group's saved epoch `epoch` had still to deliver: the indices its ranks wanted
/// (each rank's dealt share, or what its position says it wants) that no rank delivered.
/// The positions are [`group_state`]'s, of a feed of `n` samples.
pub fn remainder(n: u64, positions: &[SavedPosition], epoch: u64) -> Result<Bitmap, PlanError> {
    let words = usize::try_from(n.div_ceil(64)).unwrap_or(usize::MAX);
    let oom = |_| PlanError::OutOfMemory { len: n };
    let mut wanted = try_zeroed(words).map_err(oom)?;
    let mut delivered = try_zeroed(words).map_err(oom)?;
    let or = |into: &mut [u64], set: &Bitmap| -> Result<(), PlanError> {
        if set.len() != n {
            return Err(PlanError::LengthMismatch {
                plan: n,
                saved: set.len(),
            });
        }
        into.iter_mut().zip(set.words()).for_each(|(a, b)| *a |= b);
        Ok(())
    };
    for p in positions {
        match (&p.wanted, &p.group) {
            (Some(w), _) => or(&mut wanted, w)?,
            (None, Some(g)) => match crate::plan::EpochPlan::for_rank(n, g, epoch)?.wanted() {
                Some(w) => or(&mut wanted, w)?,
                None => wanted.fill(u64::MAX),
            },
            (None, None) => wanted.fill(u64::MAX),
        }
        or(&mut delivered, &p.delivered)?;
    }
    let tail = n % 64;
    if tail != 0
        && let Some(last) = wanted.last_mut()
    {
        *last &= (1 << tail) - 1;
    }
    wanted
        .iter_mut()
        .zip(&delivered)
        .for_each(|(w, d)| *w &= !d);
    Bitmap::from_words(n, wanted).map_err(|_| PlanError::OutOfMemory { len: n })
}
