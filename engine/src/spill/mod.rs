//! L6: the spill artifact store.
