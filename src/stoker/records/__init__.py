"""Records: images and other rows, read through the one reading pipeline."""
