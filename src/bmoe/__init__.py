"""bmoe: Mixture-of-Experts inference bigger than RAM, and decisions from one prefill."""
__version__ = "0.1.0"
