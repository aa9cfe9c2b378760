//! Devices and the ops the models call on them. `cpu` is always present; `cuda` arrives
//! behind the same trait. Models never look inside a buffer: they hand buffers and packed
//! weights back to the backend, so a device-resident implementation needs no model change.

pub mod cpu;
