"""The profiler service: where training time goes, stragglers, slow nodes, utilisation."""
