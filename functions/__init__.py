"""Cloud function entry points: thin handlers over the jobplane package."""
