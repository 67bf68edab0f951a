//! Posting delivery events ([`crate::events`]) to callers' endpoints: how each request
//! is signed ([`sign`], the Standard Webhooks scheme), which URLs the gateway may post
//! to ([`policy`]), one try ([`send`]), and the relay ([`relay`]) and dispatcher
//! ([`dispatch`]) that take the stored events through the broker to their endpoints.

pub mod dispatch;
pub mod policy;
pub mod relay;
pub mod send;
pub mod sign;
