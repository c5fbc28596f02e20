//! gradwire control plane.
