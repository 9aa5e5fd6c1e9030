"""The demo data set: real photos from scikit-image with real-text captions, as shards."""
