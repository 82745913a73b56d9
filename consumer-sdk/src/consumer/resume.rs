//! Saved positions: where a consumer stands, and continuing from there.

use super::*;

impl Consumer {
    /// Where this consumer stands, to resume from later ([`Consumer::load_position`]): the
    /// epoch in progress and the indices it has delivered (batches handed out, dropped or
    /// not), or the next epoch, none delivered, when the current one is complete. The feed's
    /// identity comes with it. Encode it with [`SavedPosition::encode`] to store it beside a
    /// checkpoint.
    pub fn position(&self) -> SavedPosition {
        let state = self.state();
        let (epoch, delivered) = state.epochs.saved();
        SavedPosition {
            identity: self.identity.clone(),
            epoch,
            delivered,
            wanted: state.epochs.saved_wanted(),
            group: self.config.group.clone(),
            batch_size: self.config.batch_size,
            drop_last: self.config.drop_last,
        }
    }

    /// Continues from `position` (saved by [`Consumer::position`], by this process or an
    /// earlier one, against this producer or a restarted one of the same feed): the next
    /// [`Consumer::epoch`] is the saved epoch and delivers exactly the indices it had not
    /// delivered (a rank: of its share), then whole epochs follow. What is exact is the set
    /// of indices; each sample's augmentation follows the producer epoch it is decoded in,
    /// as for any late joiner.
    ///
    /// Refused, changing nothing, when the position belongs to another feed (naming the
    /// first difference), another group or rank, or an epoch has begun already.
    pub fn load_position(&self, position: &SavedPosition) -> Result<(), ResumeError> {
        position.check_feed(&self.identity)?;
        if position.group != self.config.group {
            let words = |g: &Option<GroupSpec>| match g {
                None => "a consumer of whole epochs".to_owned(),
                Some(g) => format!(
                    "rank {} of {} of group {:?} (even={})",
                    g.rank, g.world_size, g.name, g.even
                ),
            };
            return Err(ResumeError::OtherGroup {
                saved: words(&position.group),
                configured: words(&self.config.group),
            });
        }
        let mut state = self.state();
        state
            .epochs
            .load_wanted(
                position.epoch,
                position.wanted.as_ref(),
                &position.delivered,
            )
            .map_err(resume_error)?;
        Ok(())
    }

    /// Continues a group from the saved positions of **all** its ranks (the state a job's
    /// rank 0 gathers into its checkpoint), whatever the world size they were saved with: a
    /// job requeued on fewer nodes, or `torchrun` elastic. With the same world size this is
    /// [`Consumer::load_position`] of this rank's own position. With another, the indices the
    /// saved epoch had not delivered yet (by any rank) are dealt anew over this group's
    /// ranks ([`EpochPlan::for_rank_of_remainder`](crate::plan::EpochPlan::for_rank_of_remainder),
    /// the same on every rank): the ranks together deliver each of them once (plus `pad`'s
    /// repeats, less `drop`'s cut), none delivered before, and the epochs after are the new
    /// world size's.
    ///
    /// Refused, changing nothing, when a position belongs to another feed, the positions are
    /// of different epochs, groups or world sizes, a rank is missing or given twice
    /// ([`ResumeError::GroupState`]), this consumer is of another group or evening, or an
    /// epoch has begun already.
    pub fn load_group_positions(&self, positions: &[SavedPosition]) -> Result<(), ResumeError> {
        let Some(mine) = &self.config.group else {
            return Err(ResumeError::OtherGroup {
                saved: "the ranks of a group".into(),
                configured: "a consumer of whole epochs".into(),
            });
        };
        for position in positions {
            position.check_feed(&self.identity)?;
        }
        let (epoch, saved) =
            crate::position::group_state(positions).map_err(|reason| ResumeError::GroupState {
                group: positions
                    .first()
                    .and_then(|p| p.group.as_ref())
                    .map_or_else(String::new, |g| g.name.clone()),
                reason,
            })?;
        if (&saved.name, saved.even) != (&mine.name, mine.even) {
            return Err(ResumeError::OtherGroup {
                saved: format!("group {:?} (even={})", saved.name, saved.even),
                configured: format!("group {:?} (even={})", mine.name, mine.even),
            });
        }
        if saved.world_size == mine.world_size {
            let own = positions
                .iter()
                .find(|p| p.group.as_ref().is_some_and(|g| g.rank == mine.rank));
            // `group_state` checked that every rank is there once.
            return match own {
                Some(own) => self.load_position(own),
                None => Err(ResumeError::GroupState {
                    group: saved.name.clone(),
                    reason: format!("has no position of rank {}", mine.rank),
                }),
            };
        }
        let n = self.dataset.len;
        let remainder =
            crate::position::remainder(n, positions, epoch).map_err(ResumeError::Plan)?;
        let plan = crate::plan::EpochPlan::for_rank_of_remainder(n, mine, epoch, &remainder)
            .map_err(ResumeError::Plan)?;
        let wanted = plan.wanted().cloned().unwrap_or_else(|| remainder.clone());
        tracing::info!(
            consumer_id = self.consumer_id,
            group = %mine.name,
            rank = mine.rank,
            epoch,
            saved_world_size = saved.world_size,
            world_size = mine.world_size,
            left = remainder.count(),
            share = wanted.count(),
            "a group resumed with another world size: the rest of the saved epoch is dealt anew"
        );
        let mut state = self.state();
        state
            .epochs
            .load_wanted(epoch, Some(&wanted), &crate::plan::Bitmap::new(n))
            .map_err(resume_error)?;
        Ok(())
    }
}

fn resume_error(e: LoadError) -> ResumeError {
    match e {
        LoadError::AlreadyStarted { epoch } => ResumeError::AlreadyStarted { epoch },
        LoadError::Plan(e) => ResumeError::Plan(e),
    }
}
