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
            .load(position.epoch, &position.delivered)
            .map_err(|e| match e {
                LoadError::AlreadyStarted { epoch } => ResumeError::AlreadyStarted { epoch },
                LoadError::Plan(e) => ResumeError::Plan(e),
            })?;
        Ok(())
    }
}
