"""Settings, declared once: the recipe's typed sections (`recipe`), the measured conditions a specbench
plans (`conditions`), and the learning-rate schedule (`schedule`). Above `base`, below everything that runs."""
