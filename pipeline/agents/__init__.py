"""The worker's Faust agents, timers and their helpers; each module installs its part on the app."""
