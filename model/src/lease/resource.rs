//! The fence record: the highest fence a protected resource accepted
//! (`LEASE.FENCE`'s key).

/// A resource record: the highest fence a protected resource accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resource {
    highest: u64,
}

/// A fence below the highest accepted; carries that highest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stale {
    pub highest: u64,
}

impl Resource {
    pub fn new(highest: u64) -> Self {
        Self { highest }
    }

    #[inline]
    pub fn highest(&self) -> u64 {
        self.highest
    }

    /// Checks `fence` without recording it.
    #[inline]
    pub fn check(&self, fence: u64) -> Result<(), Stale> {
        if fence < self.highest {
            Err(Stale {
                highest: self.highest,
            })
        } else {
            Ok(())
        }
    }

    /// Records `fence` as the highest accepted; equal fences pass, so one
    /// holder may write several times under one grant.
    #[inline]
    pub fn accept(&mut self, fence: u64) -> Result<(), Stale> {
        self.check(fence)?;
        self.highest = fence;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_accepts_equal_and_higher_rejects_lower() {
        let mut r = Resource::default();
        assert_eq!(r.accept(10), Ok(()));
        assert_eq!(r.accept(10), Ok(()));
        assert_eq!(r.accept(9), Err(Stale { highest: 10 }));
        assert_eq!(r.highest(), 10);
        assert_eq!(r.accept(11), Ok(()));
        assert_eq!(r.check(10), Err(Stale { highest: 11 }));
        assert_eq!(r.highest(), 11);
    }
}
