//! Scheduling policies: ordering a waiting queue by the tree.
