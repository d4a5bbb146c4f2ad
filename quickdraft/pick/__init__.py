"""The strategy picker: each method's candidates and priors, calibration by measurement, and the
choice (``picker.pick``)."""
