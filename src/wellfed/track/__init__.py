"""The MLflow side: runs, provenance, the registry and the champion, the run's note, UI links, sweeps."""
