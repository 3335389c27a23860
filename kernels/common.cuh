// placeholder so the embed step has an input
