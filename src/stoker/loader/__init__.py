"""Reading side: datasets, loaders, resume state."""
