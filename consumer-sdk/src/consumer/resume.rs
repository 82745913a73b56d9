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
        let (epoch, delivered) = match (state.current_epoch, &state.resume) {
            // Loaded and not begun: the loaded position itself.
            (None, Some(delivered)) => (state.next_epoch, delivered.clone()),
            (Some(k), _) if !state.plan.is_complete() => (k, state.plan.delivered_set().clone()),
            _ => (state.next_epoch, Bitmap::new(self.dataset.len)),
        };
        SavedPosition {
            identity: self.identity.clone(),
            epoch,
            delivered,
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
        if let Some(epoch) = state.current_epoch {
            return Err(ResumeError::AlreadyStarted { epoch });
        }
        // The saved set must fit the saved epoch's plan.
        let mut plan = match &self.config.group {
            None => EpochPlan::try_whole(self.dataset.len),
            Some(group) => EpochPlan::for_rank(self.dataset.len, group, position.epoch),
        }
        .map_err(ResumeError::Plan)?;
        plan.restore(&position.delivered)
            .map_err(ResumeError::Plan)?;
        state.next_epoch = position.epoch;
        state.first_epoch = position.epoch;
        state.resume = Some(position.delivered.clone());
        Ok(())
    }
}
